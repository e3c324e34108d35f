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

#include "loom/config/config.h"
#include "loom/core/layer.h"

namespace loom::memory {

// Runs `next(carry)` as one recomputed unit: the returned carry's new tensors are outputs of a
// node that reruns `next` in backward (see above). Entries handed through unchanged stay what they
// were. Without grad mode, or with nothing to differentiate, it is just `next(carry)`.
core::Carry recomputed(core::Carry carry, const std::function<core::Carry(core::Carry)>& next,
                       bool has_trainable_parameters);

// Recomputes the layers it is given and passes every other layer straight on.
class RecomputeRunner : public core::LayerRunner {
 public:
  explicit RecomputeRunner(std::set<const core::Layer*> layers) : layers_(std::move(layers)) {}
  core::Carry run(const core::Layer& layer, core::Carry carry,
                  const std::function<core::Carry(core::Carry)>& next) override;
  const std::set<const core::Layer*>& layers() const { return layers_; }

 private:
  std::set<const core::Layer*> layers_;
};

// The runner `features` asks for over one stage's layers (null for recompute none): the first
// features.recompute_layers of its blocks, all of them for 0. ConfigError when the stage has fewer
// blocks than that.
std::shared_ptr<RecomputeRunner> recompute_runner(const config::FeaturesSection& features,
                                                  const core::Layers& stage_layers);

}  // namespace loom::memory
