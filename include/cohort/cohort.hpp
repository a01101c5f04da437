#pragma once
// Umbrella header: everything a training program needs.
//
//   #include <cohort/cohort.hpp>
//   using namespace cohort;

#include "cohort/core/config.hpp"
#include "cohort/core/error.hpp"
#include "cohort/core/logging.hpp"
#include "cohort/core/parallel.hpp"
#include "cohort/data/cifar10.hpp"
#include "cohort/data/dataset.hpp"
#include "cohort/data/idx.hpp"
#include "cohort/data/image_dataset.hpp"
#include "cohort/data/loader.hpp"
#include "cohort/data/mapped_dataset.hpp"
#include "cohort/data/synthetic.hpp"
#include "cohort/data/transforms.hpp"
#include "cohort/nn/activation_layer.hpp"
#include "cohort/nn/batch_normalization.hpp"
#include "cohort/nn/conv2d.hpp"
#include "cohort/nn/dense.hpp"
#include "cohort/nn/dropout.hpp"
#include "cohort/nn/flatten.hpp"
#include "cohort/nn/loss.hpp"
#include "cohort/nn/pooling2d.hpp"
#include "cohort/nn/sequential.hpp"
#include "cohort/nn/zoo.hpp"
#include "cohort/optim/adam.hpp"
#include "cohort/optim/rmsprop.hpp"
#include "cohort/optim/sgd.hpp"
#include "cohort/tensor/ops.hpp"
#include "cohort/tensor/tensor.hpp"
#include "cohort/train/trainer.hpp"
