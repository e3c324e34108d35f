// Precompiled header: the heavy libtorch headers most translation units need.
#pragma once
#include <ATen/ATen.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/custom_function.h>
#include <torch/nn/module.h>

#include <map>
#include <memory>
#include <string>
#include <vector>
