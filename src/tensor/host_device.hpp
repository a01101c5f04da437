#pragma once
// COHORT_HOST_DEVICE marks the small functions that the CPU backend and the CUDA kernels share, so that
// both devices do the same arithmetic: __host__ __device__ under nvcc, nothing elsewhere.
#ifdef __CUDACC__
#define COHORT_HOST_DEVICE __host__ __device__
#else
#define COHORT_HOST_DEVICE
#endif
