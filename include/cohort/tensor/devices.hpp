#pragma once
// Which devices this process can compute on, and the choice behind a `--device cpu|cuda|auto` flag.
//
//   const Device device = choose_device(args.device);   // "auto": CUDA when a GPU is visible, else CPU
//   nn::Sequential model(shape, seed, device);

#include <string>
#include <string_view>

#include "cohort/core/device.hpp"
#include "cohort/core/dtype.hpp"

namespace cohort {

// CPU and Emulated always; CUDA when this build has the CUDA backend and a GPU is visible. Never throws.
bool device_available(Device device);
// Why `device` cannot be used here ("" when it can): the build option, or what the driver said.
std::string device_unavailable_reason(Device device);
// What computes ops on 16-bit `type` operands on `device`, for reports: "native (oneDNN on AMX-BF16)", or
// "float32 stand-ins: ..." with the reason.
std::string kernels_for(Device device, DType type);
// "cpu", "cuda", "emulated" or "auto" (CUDA when available, else CPU). InvalidArgument for another name;
// DeviceError with the reason for a device this process cannot use.
Device choose_device(std::string_view name);
// How the GPU computes; it takes these choices when this process first uses it, and changing one after that
// is an InvalidArgument.
//
// Whether float32 convolutions and matrix products run on TF32 tensor cores (float32's range and
// accumulation, a 10-bit mantissa), as TensorFlow's and PyTorch's cuDNN convolutions do by default: allowed
// unless COHORT_ALLOW_TF32=0 or allow_tf32(false), either of which gives strict FP32 (what the device parity
// tests compare).
void allow_tf32(bool allowed);
bool tf32_allowed();
// Whether convolutions keep to deterministic algorithms (the same bits run after run), chosen by cuDNN's
// heuristics: yes unless COHORT_DETERMINISTIC=0 or use_deterministic_algorithms(false), which times every
// algorithm of a convolution once per shape and keeps the fastest, as PyTorch's cudnn.benchmark does.
void use_deterministic_algorithms(bool deterministic);
bool deterministic_algorithms();
// The CUDA ordinal (among CUDA_VISIBLE_DEVICES) of the GPU this process computes on: COHORT_CUDA_DEVICE,
// else the local rank (LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK) modulo the GPUs, else 0. DeviceError where
// CUDA cannot be used.
int cuda_device_index();

}  // namespace cohort
