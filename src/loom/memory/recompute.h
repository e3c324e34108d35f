// Activation recompute: a layer run under it keeps only its inputs through backward, not the
// tensors its operations save, and runs its forward again when backward reaches it.
//
// Forward runs the rest of the chain (and the layer) without autograd and hangs every new tensor of
// the carry on one node, RecomputeBackward, which holds the layer's inputs and a copy of the
// chain's `next`. When the gradients of those outputs arrive, the node runs `next` again with
// autograd on, from the same inputs and the same random generator state, backpropagates through
// that second graph (a nested backward, which accumulates the layer's parameter gradients as the
// plain run would), and passes on its inputs' gradients. The arithmetic is the plain run's, so
// losses and gradients are bit-identical to it.
//
// In a runner chain it sits inside FSDP: FSDP gathers the layer's parameters for the forward and,
// from its hook on the layer's outputs, again before this node runs in backward.
#pragma once
#include <functional>
#include <memory>
#include <set>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/layer.h"
#include "loom/memory/offload.h"

namespace loom::memory {

// Runs `next(carry)` as one recomputed unit: the returned carry's new tensors are outputs of a
// node that reruns `next` in backward (see above). Entries handed through unchanged stay what they
// were. Without grad mode, or with nothing to differentiate, it is just `next(carry)`. With an
// offloader, the inputs the node keeps (those it does not hand on) are moved out to it after the
// run and read back when backward comes near (offload.h).
core::Carry recomputed(core::Carry carry, const std::function<core::Carry(core::Carry)>& next,
                       bool has_trainable_parameters, Offloader* offloader = nullptr);

// fn(inputs) as one recomputed unit, as `recomputed` runs a layer: backward keeps the inputs, not
// what fn's operations save, and runs fn again. fn must own what it captures.
at::Tensor checkpoint(std::function<at::Tensor(const std::vector<at::Tensor>&)> fn,
                      const std::vector<at::Tensor>& inputs);

// A tensor selective recompute empties after its block's forward and makes again before the block's
// backward.
struct Refill {
  at::Tensor tensor;
  std::function<at::Tensor()> remake;
};

// Selective recompute: while a scope is alive on this thread, the operations between a layer's
// projections that save much and cost little to run again (the composite attention's scores and
// probabilities, the vision MLP's QuickGELU) run under `checkpoint`, and the outputs of norms and
// activations, which the next projection saves, are handed to `refilled_in_backward`; nn asks
// `selective()`.
class SelectiveScope {
 public:
  explicit SelectiveScope(std::vector<Refill>* refills = nullptr);
  ~SelectiveScope();
  SelectiveScope(const SelectiveScope&) = delete;
  SelectiveScope& operator=(const SelectiveScope&) = delete;

 private:
  bool previous_;
  std::vector<Refill>* previous_refills_;
};
bool selective();

// Under a selective scope that collects them, and with grad: hands `output` back and has the block's
// runner empty its storage after the block's forward and fill it again with remake() before the
// block's backward, so what autograd saved of it sees the same values again. remake runs without
// grad, must give a contiguous tensor of output's shape, and must own what it reads (what the
// block's backward keeps anyway: a norm's input and weight, an activation's input). Otherwise, and
// for a tensor that is not the sole user of its storage, it does nothing.
at::Tensor refilled_in_backward(at::Tensor output, std::function<at::Tensor()> remake);

// Recomputes the layers it is given, wholly (full) or selectively, and passes every other layer
// straight on.
class RecomputeRunner : public core::LayerRunner {
 public:
  RecomputeRunner(std::set<const core::Layer*> layers, bool selective,
                  std::shared_ptr<Offloader> offloader = {})
      : layers_(std::move(layers)), selective_(selective), offloader_(std::move(offloader)) {}
  core::Carry run(const core::Layer& layer, core::Carry carry,
                  const std::function<core::Carry(core::Carry)>& next) override;
  const std::set<const core::Layer*>& layers() const { return layers_; }
  // Selective runs outside FSDP (its refill hooks must follow FSDP's gather), full inside it (its
  // rerun must not pass through FSDP again).
  bool selective() const { return selective_; }
  // Where full recompute's kept inputs go (features.offload); null when they stay.
  const std::shared_ptr<Offloader>& offloader() const { return offloader_; }

 private:
  std::set<const core::Layer*> layers_;
  bool selective_;
  std::shared_ptr<Offloader> offloader_;
};

// The runner `features` asks for over one stage's layers (null for recompute none): the first
// features.recompute_layers of its blocks, all of them for 0, their inputs offloaded with
// features.offload (with full; the config refuses it with selective). ConfigError when the stage
// has fewer blocks than that.
std::shared_ptr<RecomputeRunner> recompute_runner(const config::FeaturesSection& features,
                                                  const core::Layers& stage_layers);

}  // namespace loom::memory
