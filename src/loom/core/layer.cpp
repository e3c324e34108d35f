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

// The chain from runner `index` on, ending in the layer's own forward.
Carry run_from(const RunnerChain& runners, size_t index, const Layer& layer, Carry carry,
               const Context& context) {
  if (index == runners.size()) return layer.forward(std::move(carry), context);
  return runners[index]->run(layer, std::move(carry), [&](Carry c) {
    return run_from(runners, index + 1, layer, std::move(c), context);
  });
}

}  // namespace

Carry run_layers(const Layers& layers, const RunnerChain& runners, Carry carry, const Context& context) {
  for (const auto& layer : layers)
    if (layer->active(carry, context)) carry = run_from(runners, 0, *layer, std::move(carry), context);
  return carry;
}

}  // namespace loom::core
