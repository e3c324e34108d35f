#include "loom/memory/recompute.h"

#include <ATen/Context.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/function.h>
#include <torch/csrc/autograd/functions/utils.h>
#include <torch/csrc/autograd/saved_variable.h>

#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "loom/util/errors.h"
#include "loom/util/tensor_storage.h"

namespace loom::memory {
namespace {

using torch::autograd::variable_list;

// The states of the random generators a layer may draw from: the CPU's, and its device's.
class GeneratorStates {
 public:
  GeneratorStates() = default;
  explicit GeneratorStates(const core::Carry& carry) {
    devices_.emplace_back(at::kCPU);
    for (const auto& [name, tensor] : carry.tensors())
      if (tensor.defined() && !tensor.device().is_cpu()) {
        devices_.push_back(tensor.device());
        break;
      }
    for (const auto& device : devices_) states_.push_back(state_of(device));
  }
  // Puts these states in place and hands back the ones they replaced.
  GeneratorStates swap_in() const {
    GeneratorStates previous;
    previous.devices_ = devices_;
    for (size_t i = 0; i < devices_.size(); ++i) {
      at::Generator generator = at::globalContext().defaultGenerator(devices_[i]);
      std::lock_guard<std::mutex> lock(generator.mutex());
      previous.states_.push_back(generator.get_state());
      generator.set_state(states_[i]);
    }
    return previous;
  }

 private:
  static at::Tensor state_of(const at::Device& device) {
    at::Generator generator = at::globalContext().defaultGenerator(device);
    std::lock_guard<std::mutex> lock(generator.mutex());
    return generator.get_state();
  }

  std::vector<at::Device> devices_;
  std::vector<at::Tensor> states_;
};

// While alive, the generators hold the states of a recomputed forward.
class ReplayedGenerators {
 public:
  explicit ReplayedGenerators(const GeneratorStates& states) : previous_(states.swap_in()) {}
  ~ReplayedGenerators() { previous_.swap_in(); }
  ReplayedGenerators(const ReplayedGenerators&) = delete;
  ReplayedGenerators& operator=(const ReplayedGenerators&) = delete;

 private:
  GeneratorStates previous_;
};

// The backward of one recomputed run: its inputs are the carry entries that need a gradient, its
// outputs the new tensors the run made.
class RecomputeBackward : public torch::autograd::Node {
 public:
  explicit RecomputeBackward(std::function<core::Carry(core::Carry)> next) : next_(std::move(next)) {}

  std::string name() const override { return "loom::RecomputeBackward"; }

  // Entry `name` of the input carry is differentiable input `index` (several names may share one).
  void add_input(const std::string& name, size_t index, const at::Tensor& tensor) {
    if (index == saved_.size()) saved_.emplace_back(tensor, /*is_output=*/false);
    inputs_.emplace_back(name, index);
  }
  void keep(const std::string& name, const at::Tensor& tensor) { kept_.emplace_back(name, tensor); }
  void add_output(const std::string& name) { outputs_.push_back(name); }
  void set_generators(GeneratorStates states) { generators_ = std::move(states); }

  // Moves the kept inputs that can be moved, and whose storage nothing in `handed_on` shares, out to
  // the offloader's spill file: the node holds where they lie instead of the tensors.
  void offload(Offloader& offloader, const std::set<const c10::StorageImpl*>& handed_on) {
    std::vector<at::Tensor> moving;
    slots_.assign(saved_.size(), -1);
    for (size_t i = 0; i < saved_.size(); ++i) {
      const at::Tensor t = saved_[i].unpack().detach();
      if (!Offloader::movable(t) || handed_on.count(t.storage().unsafeGetStorageImpl()) != 0) continue;
      slots_[i] = static_cast<int>(moving.size());
      moving.push_back(t);
    }
    if (moving.empty()) return;
    offloaded_ = offloader.move_out(moving);
    for (size_t i = 0; i < saved_.size(); ++i)
      if (slots_[i] >= 0) saved_[i].reset_data();
  }

  variable_list apply(variable_list&& grads) override {
    if (!next_)
      throw ModelError("recompute: a layer's backward ran twice (its inputs were already released)");
    // The block run before this one is backward's next: its offloaded inputs start coming back.
    if (offloaded_)
      if (auto previous = offloaded_->previous.lock()) previous->prefetch();
    std::vector<at::Tensor> leaves;
    for (size_t i = 0; i < saved_.size(); ++i) {
      at::Tensor leaf = !slots_.empty() && slots_[i] >= 0
                            ? offloaded_->tensors[static_cast<size_t>(slots_[i])]->take()
                            : saved_[i].unpack().detach();
      leaf.requires_grad_(true);
      leaves.push_back(std::move(leaf));
    }
    offloaded_.reset();
    core::Carry carry;
    for (const auto& [name, index] : inputs_) carry.set(name, leaves[index]);
    for (const auto& [name, tensor] : kept_) carry.set(name, tensor);
    core::Carry out;
    {
      const ReplayedGenerators replay(generators_);
      const at::AutoGradMode grad_mode(true);
      out = next_(std::move(carry));
    }
    std::vector<at::Tensor> roots, root_grads;
    for (size_t k = 0; k < outputs_.size(); ++k) {
      if (!grads[k].defined()) continue;
      const at::Tensor& made = out.get(outputs_[k]);
      if (made.requires_grad()) {
        roots.push_back(made);
        root_grads.push_back(grads[k]);
      }
    }
    if (!roots.empty()) torch::autograd::backward(roots, root_grads);
    variable_list result;
    for (const auto& leaf : leaves) result.push_back(leaf.grad());
    return result;
  }

  void release_variables() override {
    for (auto& saved : saved_) saved.reset_data();
    kept_.clear();
    offloaded_.reset();
    next_ = nullptr;
  }

 private:
  std::function<core::Carry(core::Carry)> next_;
  std::vector<torch::autograd::SavedVariable> saved_;
  std::vector<std::pair<std::string, size_t>> inputs_;
  std::vector<std::pair<std::string, at::Tensor>> kept_;
  std::vector<std::string> outputs_;
  GeneratorStates generators_;
  std::shared_ptr<OffloadGroup> offloaded_;
  std::vector<int> slots_;  // per saved input: its place in offloaded_, or -1 when kept here
};

}  // namespace

core::Carry recomputed(core::Carry carry, const std::function<core::Carry(core::Carry)>& next,
                       bool has_trainable_parameters, Offloader* offloader) {
  bool input_needs_grad = false;
  for (const auto& [name, tensor] : carry.tensors()) input_needs_grad |= tensor.requires_grad();
  if (!at::GradMode::is_enabled() || (!input_needs_grad && !has_trainable_parameters))
    return next(std::move(carry));

  auto node = c10::make_intrusive<RecomputeBackward>(next);
  node->set_generators(GeneratorStates(carry));
  // The run sees detached inputs, so nothing it makes is a no-grad view of a differentiable tensor;
  // an entry it hands back unchanged is given back as the original.
  core::Carry detached;
  std::map<const void*, at::Tensor> original_of;
  std::map<const void*, size_t> input_of;
  torch::autograd::edge_list edges;
  for (const auto& [name, tensor] : carry.tensors()) {
    if (!tensor.defined()) {
      detached.set(name, tensor);
      continue;
    }
    at::Tensor plain = tensor.detach();
    original_of.emplace(plain.unsafeGetTensorImpl(), tensor);
    detached.set(name, plain);
    if (!tensor.requires_grad()) {
      node->keep(name, tensor);
      continue;
    }
    const auto [it, added] = input_of.emplace(tensor.unsafeGetTensorImpl(), edges.size());
    if (added) edges.push_back(torch::autograd::impl::gradient_edge(tensor));
    node->add_input(name, it->second, tensor);
  }
  node->set_next_edges(std::move(edges));
  carry = core::Carry();

  core::Carry out;
  {
    const at::NoGradGuard no_grad;
    out = next(std::move(detached));
  }
  core::Carry result;
  std::map<const void*, at::Tensor> made;  // one output per tensor, however many names it has
  for (const auto& [name, tensor] : out.tensors()) {
    if (!tensor.defined() || tensor.requires_grad() || !at::isFloatingType(tensor.scalar_type())) {
      result.set(name, tensor);
      continue;
    }
    const void* impl = tensor.unsafeGetTensorImpl();
    if (const auto it = original_of.find(impl); it != original_of.end()) {
      result.set(name, it->second);
      continue;
    }
    auto it = made.find(impl);
    if (it == made.end()) {
      at::Tensor output = tensor;
      torch::autograd::set_history(output, node);
      node->add_output(name);
      it = made.emplace(impl, output).first;
    }
    result.set(name, it->second);
  }
  if (offloader) {
    std::set<const c10::StorageImpl*> handed_on;
    for (const auto& [name, tensor] : result.tensors())
      if (tensor.defined()) handed_on.insert(tensor.storage().unsafeGetStorageImpl());
    node->offload(*offloader, handed_on);
  }
  return result;
}

namespace {

thread_local bool selective_on = false;
thread_local std::vector<Refill>* collected = nullptr;

// Makes every emptied tensor again, in its own storage: the new data pointer moves in without
// touching the tensor's version, which autograd checks.
void refill(std::vector<Refill>& refills) {
  const at::NoGradGuard no_grad;
  for (auto& r : refills) {
    c10::StorageImpl* storage = r.tensor.storage().unsafeGetStorageImpl();
    const at::Tensor fresh = r.remake().contiguous();
    const size_t bytes = static_cast<size_t>(r.tensor.numel()) * r.tensor.element_size();
    if (fresh.sizes() != r.tensor.sizes() || fresh.scalar_type() != r.tensor.scalar_type() ||
        fresh.storage_offset() != 0 || fresh.storage().nbytes() != bytes)
      throw ModelError("selective recompute: a refilled tensor came back in another shape or type");
    if (fresh.storage().use_count() > 1 || fresh.use_count() > 1) {  // shared: copy rather than take it
      storage->set_data_ptr_noswap(storage->allocator()->allocate(bytes));
      storage->set_nbytes(bytes);
      std::memcpy(r.tensor.data_ptr(), fresh.data_ptr(), bytes);
    } else {
      c10::StorageImpl* made = fresh.storage().unsafeGetStorageImpl();
      storage->set_data_ptr_noswap(made->set_data_ptr(at::DataPtr(nullptr, fresh.device())));
      storage->set_nbytes(bytes);
    }
  }
  refills.clear();
}

}  // namespace

SelectiveScope::SelectiveScope(std::vector<Refill>* refills)
    : previous_(selective_on), previous_refills_(collected) {
  selective_on = true;
  collected = refills;
}
SelectiveScope::~SelectiveScope() {
  selective_on = previous_;
  collected = previous_refills_;
}
bool selective() { return selective_on; }

at::Tensor refilled_in_backward(at::Tensor output, std::function<at::Tensor()> remake) {
  if (!collected || !at::GradMode::is_enabled() || !output.defined() || !owns_storage(output)) return output;
  collected->push_back(Refill{output, std::move(remake)});
  return output;
}

at::Tensor checkpoint(std::function<at::Tensor(const std::vector<at::Tensor>&)> fn,
                      const std::vector<at::Tensor>& inputs) {
  core::Carry carry;
  for (size_t i = 0; i < inputs.size(); ++i) carry.set(std::to_string(i), inputs[i]);
  const size_t count = inputs.size();
  auto run = [fn = std::move(fn), count](core::Carry c) {
    std::vector<at::Tensor> tensors;
    for (size_t i = 0; i < count; ++i) tensors.push_back(c.get(std::to_string(i)));
    core::Carry out;
    out.set("out", fn(tensors));
    return out;
  };
  return recomputed(std::move(carry), run, false).get("out");
}

core::Carry RecomputeRunner::run(const core::Layer& layer, core::Carry carry,
                                 const std::function<core::Carry(core::Carry)>& next) {
  if (layers_.count(&layer) == 0) return next(std::move(carry));
  if (selective_) {
    std::set<const void*> inputs;
    for (const auto& [name, tensor] : carry.tensors()) inputs.insert(tensor.unsafeGetTensorImpl());
    std::vector<Refill> refills;
    core::Carry out;
    {
      const SelectiveScope scope(&refills);
      out = next(std::move(carry));
    }
    // What the block hands on is not emptied, nor anything sharing its storage.
    std::set<const void*> kept;
    for (const auto& [name, tensor] : out.tensors())
      if (tensor.defined()) kept.insert(tensor.storage().unsafeGetStorageImpl());
    auto pending = std::make_shared<std::vector<Refill>>();
    for (auto& r : refills)
      if (kept.count(r.tensor.storage().unsafeGetStorageImpl()) == 0) pending->push_back(std::move(r));
    if (pending->empty()) return out;
    // Backward reaches the block when the gradient of what it made arrives; this hook is registered
    // after those of the runners inside (FSDP gathers the weights first).
    bool hooked = false;
    for (const auto& [name, tensor] : out.tensors())
      if (tensor.requires_grad() && inputs.count(tensor.unsafeGetTensorImpl()) == 0) {
        at::Tensor made = tensor;
        made.register_hook([pending](const at::Tensor&) { refill(*pending); });
        hooked = true;
      }
    if (hooked)
      for (const auto& r : *pending) release_storage(r.tensor);
    return out;
  }
  bool trainable = false;
  for (const auto& param : layer.module().parameters()) trainable |= param.requires_grad();
  return recomputed(std::move(carry), next, trainable, offloader_.get());
}

std::shared_ptr<RecomputeRunner> recompute_runner(const config::FeaturesSection& features,
                                                  const core::Layers& stage_layers) {
  if (features.recompute == "none") return nullptr;
  if (features.recompute != "full" && features.recompute != "selective")
    throw ConfigError(fmt::format("features.recompute: unknown mode {}", features.recompute));
  if (stage_layers.empty()) return nullptr;
  std::vector<const core::Layer*> blocks;
  for (const auto& layer : stage_layers)
    if (layer->block()) blocks.push_back(layer.get());
  if (blocks.empty())
    throw ConfigError(
        fmt::format("features.recompute: {} recomputes the model's blocks, and this model "
                    "has none (its layers are {} ... {})",
                    features.recompute, stage_layers.front()->name(), stage_layers.back()->name()));
  const size_t count =
      features.recompute_layers == 0 ? blocks.size() : static_cast<size_t>(features.recompute_layers);
  if (count > blocks.size())
    throw ConfigError(
        fmt::format("features.recompute_layers: {} is more than the {} blocks of this stage ({} ... {})",
                    count, blocks.size(), blocks.front()->name(), blocks.back()->name()));
  const bool selective = features.recompute == "selective";
  std::shared_ptr<Offloader> offloader;
  if (features.offload && !selective) {
    offloader = std::make_shared<Offloader>();
    spdlog::info(
        "offload: the recomputed blocks' inputs go to a spill file in {} after their forward and are "
        "read back one block ahead in backward",
        offloader->path());
  }
  spdlog::info("recompute {}: {} of {} blocks ({} ... {}) {}", features.recompute, count, blocks.size(),
               blocks.front()->name(), blocks[count - 1]->name(),
               selective
                   ? "make their attention scores and their norms' and activations' outputs again in backward"
                   : "keep only their inputs and run their forward again in backward");
  return std::make_shared<RecomputeRunner>(
      std::set<const core::Layer*>(blocks.begin(), blocks.begin() + count), selective, std::move(offloader));
}

}  // namespace loom::memory
