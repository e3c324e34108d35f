// A model's forward pass as an ordered list of layers. Each layer maps a carry (a few named
// tensors: hidden, vision_hidden, image_embeds, ...) to the next carry, reading a per-micro-batch
// context its model built once before the first layer (positions, rotary tables, cu_seqlens,
// window indexes). Layers are the units that FSDP shards, recompute and offload wrap, and pipeline
// stages are cut from; a layer is named by the path that prefixes its parameters' names
// (visual.blocks.3, model.layers.0).
//
// Runners wrap a layer from outside without the model knowing: FSDP gathers the layer's
// parameters just before it runs and frees them after; recompute and offload re-run it or move
// its activations. They form a chain, outermost first, each calling the next and the last calling
// the layer.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace loom::core {

// The named tensors one layer hands the next.
class Carry {
 public:
  bool has(const std::string& name) const { return tensors_.count(name) > 0; }
  // ModelError naming the entry and what the carry holds when it is absent.
  const at::Tensor& get(const std::string& name) const;
  void set(const std::string& name, at::Tensor value) { tensors_[name] = std::move(value); }
  // get, then drop it from the carry.
  at::Tensor take(const std::string& name);
  const std::map<std::string, at::Tensor>& tensors() const { return tensors_; }

 private:
  std::map<std::string, at::Tensor> tensors_;
};

// What every layer of one micro-batch's forward may read; each family derives its own.
class Context {
 public:
  virtual ~Context() = default;
};

class Layer {
 public:
  Layer(std::string name, std::shared_ptr<torch::nn::Module> module)
      : name_(std::move(name)), module_(std::move(module)) {}
  virtual ~Layer() = default;
  Layer(const Layer&) = delete;
  Layer& operator=(const Layer&) = delete;

  // The path that prefixes its parameters' names, and the module holding them.
  const std::string& name() const { return name_; }
  const torch::nn::Module& module() const { return *module_; }

  // One of the model's repeated blocks (a transformer block): the FSDP units when
  // parallel.fsdp_plan names none.
  virtual bool block() const { return false; }
  // The tower it belongs to (visual, llm, dit): model.pipeline_layers lists each tower's blocks per
  // pipeline stage. "": the model is not cut into pipeline stages.
  virtual std::string tower() const { return ""; }
  // Whether something outside the layers also reads its parameters (a tied LM head reads the token
  // embedding), so FSDP cannot free them after the layer runs.
  virtual bool parameters_read_outside() const { return false; }
  // Whether it has work in this micro-batch (a vision layer has none without images); a layer
  // without work is passed over, its carry unchanged, and no runner sees it.
  virtual bool active(const Carry& carry, const Context& context) const {
    (void)carry;
    (void)context;
    return true;
  }
  virtual Carry forward(Carry carry, const Context& context) const = 0;

 private:
  std::string name_;
  std::shared_ptr<torch::nn::Module> module_;
};

using Layers = std::vector<std::shared_ptr<const Layer>>;

class LayerRunner {
 public:
  virtual ~LayerRunner() = default;
  // Runs `layer` on `carry` through `next` (the rest of the chain, then the layer itself) and
  // returns the carry it gives. `next` may be copied, kept and called again after `run` returns
  // (recompute runs it once more in backward): it owns what it needs, the layer and the context
  // included, and runners inside it see each of those calls.
  virtual Carry run(const Layer& layer, Carry carry, const std::function<Carry(Carry)>& next) = 0;
};

// The runners every layer of a stage goes through, outermost first.
using RunnerChain = std::vector<std::shared_ptr<LayerRunner>>;

// Each active layer in turn, through the chain. The chain's `next` may outlive the call (see
// LayerRunner::run), so it shares the context.
Carry run_layers(const Layers& layers, const RunnerChain& runners, Carry carry,
                 std::shared_ptr<const Context> context);
// The same without runners, over a borrowed context (inference, the VAE's encode and decode).
Carry run_layers(const Layers& layers, Carry carry, const Context& context);

// A contiguous run of a model's layers that one rank runs, with the runners they go through. The
// first stage starts from an empty carry; the last one's carry ends in the task's loss.
struct Stage {
  Layers layers;
  RunnerChain runners;
  bool first = true, last = true;

  Carry forward(Carry carry, std::shared_ptr<const Context> context) const {
    return run_layers(layers, runners, std::move(carry), std::move(context));
  }
};

}  // namespace loom::core
