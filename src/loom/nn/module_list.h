// A container module whose children are named by position ("0", "1", ...) or by a given name,
// giving HuggingFace-style parameter paths such as blocks.3.attn.qkv.weight or mlp.2.bias.
#pragma once
#include <torch/nn/module.h>

#include <memory>
#include <string>

namespace loom::nn {

class ModuleList : public torch::nn::Module {
 public:
  template <typename M>
  std::shared_ptr<M> append(std::shared_ptr<M> module) {
    return add(std::to_string(size_++), std::move(module));
  }
  template <typename M>
  std::shared_ptr<M> add(const std::string& name, std::shared_ptr<M> module) {
    register_module(name, module);
    return module;
  }

 private:
  int64_t size_ = 0;
};

// A module holding only a weight parameter of a given shape (e.g. a convolution kernel that Loom
// applies as a matrix product).
class WeightHolder : public torch::nn::Module {
 public:
  WeightHolder(at::IntArrayRef shape, const at::TensorOptions& options) {
    weight = register_parameter("weight", at::empty(shape, options));
  }
  at::Tensor weight;
};

}  // namespace loom::nn
