// What the trainer, the parallel plan and the tasks see of a model, whatever its family: its
// parameters under HuggingFace names, its layers in forward order (core/layer.h) and its
// HuggingFace config. How a micro-batch becomes the context its layers read is the family's own
// (the task that trains it knows the family); what the last layer's carry ends in (a loss through
// the LM head, a velocity error) is the task's.
#pragma once
#include <torch/nn/module.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "loom/core/layer.h"

namespace loom::core {

class Model {
 public:
  virtual ~Model() = default;
  // The module holding every parameter, under its HuggingFace name.
  virtual torch::nn::Module& module() = 0;
  const torch::nn::Module& module() const { return const_cast<Model*>(this)->module(); }
  // The layers in the order a forward pass runs them.
  virtual Layers layers() const = 0;
  // The model's architecture as a HuggingFace config.json object.
  virtual nlohmann::json hf_config() const = 0;
  // Module paths a user may name in model.freeze, for the error that lists them.
  virtual std::vector<std::string> freeze_examples() const = 0;
  // A mixture-of-experts model's experts per layer and its layers that route (every layer's row in
  // the report ForwardResult::expert_tokens makes of a step); 0 for a dense model.
  virtual int64_t experts() const { return 0; }
  virtual int64_t routed_layers() const { return 0; }
  // After each optimizer step of a mixture of experts: `picks` (routed_layers, experts), the step's
  // picks of each layer's experts over every rank. A model with routing state (an expert bias) moves it.
  virtual void end_step(const at::Tensor& picks) { (void)picks; }
};

}  // namespace loom::core
