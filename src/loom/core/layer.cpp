#include "loom/core/layer.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "loom/util/errors.h"

namespace loom::core {

const at::Tensor& Carry::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::vector<std::string> held;
    for (const auto& entry : tensors_) held.push_back(entry.first);
    throw ModelError(
        fmt::format("a layer needs '{}' in its carry, which holds {}", name,
                    held.empty() ? std::string("nothing") : fmt::format("{}", fmt::join(held, ", "))));
  }
  return it->second;
}

at::Tensor Carry::take(const std::string& name) {
  at::Tensor out = get(name);
  tensors_.erase(name);
  return out;
}

namespace {

// What the chain's `next` keeps of one layer's run: its own copies, so it can be called again after
// run_layers has returned.
struct ChainCall {
  RunnerChain runners;
  std::shared_ptr<const Layer> layer;
  std::shared_ptr<const Context> context;
};

// The chain from runner `index` on, ending in the layer's own forward.
Carry run_from(const std::shared_ptr<const ChainCall>& call, size_t index, Carry carry) {
  if (index == call->runners.size()) return call->layer->forward(std::move(carry), *call->context);
  return call->runners[index]->run(*call->layer, std::move(carry), [call, index](Carry c) {
    return run_from(call, index + 1, std::move(c));
  });
}

}  // namespace

Carry run_layers(const Layers& layers, const RunnerChain& runners, Carry carry,
                 std::shared_ptr<const Context> context) {
  for (const auto& layer : layers) {
    if (!layer->active(carry, *context)) continue;
    if (runners.empty()) {
      carry = layer->forward(std::move(carry), *context);
      continue;
    }
    auto call = std::make_shared<const ChainCall>(ChainCall{runners, layer, context});
    carry = run_from(call, 0, std::move(carry));
  }
  return carry;
}

Carry run_layers(const Layers& layers, Carry carry, const Context& context) {
  for (const auto& layer : layers)
    if (layer->active(carry, context)) carry = layer->forward(std::move(carry), context);
  return carry;
}

}  // namespace loom::core
