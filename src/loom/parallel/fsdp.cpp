#include "loom/parallel/fsdp.h"

#include <c10/core/StorageImpl.h>
#include <fmt/format.h>
#include <torch/csrc/autograd/variable.h>

#include <algorithm>
#include <chrono>
#include <numeric>

#include "loom/dist/gradient_ready_hook.h"
#include "loom/util/errors.h"
#include "loom/util/tensor_storage.h"

namespace loom::parallel {

namespace {

// A unit's whole buffer keeps its tensor (and the parameters viewing it) while its memory comes and
// goes (util/tensor_storage.h): the storage is emptied when the unit is freed and refilled before it
// is gathered. Tensors that autograd saved from the parameters share that storage, so they see the
// gathered values again when backward needs them.

std::vector<std::string> split_path(const std::string& path) {
  std::vector<std::string> parts;
  size_t begin = 0;
  while (true) {
    const size_t dot = path.find('.', begin);
    parts.push_back(path.substr(begin, dot == std::string::npos ? std::string::npos : dot - begin));
    if (dot == std::string::npos) return parts;
    begin = dot + 1;
  }
}

bool is_index(const std::string& s) {
  return !s.empty() && s.size() < 10 &&
         std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
}

bool part_matches(const std::string& pattern, const std::string& part) {
  if (pattern == "{*}") return is_index(part);
  if (pattern.size() > 2 && pattern.front() == '{' && pattern.back() == '}') {
    const std::string range = pattern.substr(1, pattern.size() - 2);
    const size_t dash = range.find('-');
    if (dash == std::string::npos || !is_index(range.substr(0, dash)) || !is_index(range.substr(dash + 1)) ||
        !is_index(part))
      return false;
    const int64_t value = std::stoll(part);
    return value >= std::stoll(range.substr(0, dash)) && value <= std::stoll(range.substr(dash + 1));
  }
  return pattern == part;
}

}  // namespace

bool fsdp_plan_matches(const std::string& pattern, const std::string& path) {
  const auto want = split_path(pattern), have = split_path(path);
  if (want.size() != have.size()) return false;
  for (size_t i = 0; i < want.size(); ++i)
    if (!part_matches(want[i], have[i])) return false;
  return true;
}

std::vector<bool> fsdp_planned_layers(const std::vector<std::string>& plan, const core::Layers& layers) {
  std::vector<bool> planned(layers.size(), false);
  for (const std::string& pattern : plan) {
    bool any = false;
    for (size_t l = 0; l < layers.size(); ++l) {
      if (!fsdp_plan_matches(pattern, layers[l]->name())) continue;
      if (layers[l]->parameters_read_outside())
        throw ConfigError(fmt::format(
            "parallel.fsdp_plan: '{}' names {}, whose parameters are also read outside it (a tied LM head "
            "reads the token embedding): it stays in the root unit",
            pattern, layers[l]->name()));
      planned[l] = any = true;
    }
    if (!any)
      throw ConfigError(fmt::format(
          "parallel.fsdp_plan: '{}' names no layer of this model; its layers are {} to {} (patterns such "
          "as visual.blocks.{{*}}, model.layers.{{0-3}})",
          pattern, layers.empty() ? "none" : layers.front()->name(),
          layers.empty() ? "none" : layers.back()->name()));
  }
  return planned;
}

struct FullyShardedModel::Unit {
  std::string name;  // the layer's path, or "root"
  std::shared_ptr<FlatShard> shard;
  at::Tensor whole;  // every parameter's values end to end (padded); storage only while gathered
  bool gathered = false;
  std::unique_ptr<dist::PendingWork> gather;
  std::vector<bool> ready;  // gradient final in this pass
  size_t waiting = 0;       // gradients not yet final in this pass
  int64_t ready_bytes = 0;  // bytes of the whole gradients that are final and not yet reduced
  std::unique_ptr<dist::PendingWork> reduce;
  at::Tensor reduced;  // this rank's slice of the pass's summed gradient
  int64_t reduce_bytes = 0;
};

FullyShardedModel::FullyShardedModel(std::shared_ptr<dist::Comm> comm,
                                     const std::vector<std::pair<std::string, at::Tensor>>& params,
                                     const core::Layers& layers, const std::vector<std::string>& plan) {
  const std::vector<bool> planned = fsdp_planned_layers(plan, layers);
  std::vector<std::vector<std::pair<std::string, at::Tensor>>> members(layers.size() + 1);  // 0: root
  for (const auto& [name, param] : params) {
    size_t target = 0;
    for (size_t l = 0; l < layers.size(); ++l)
      if (planned[l] && name.rfind(layers[l]->name() + ".", 0) == 0) target = l + 1;
    members[target].emplace_back(name, param);
  }
  // A layer none of whose parameters trains stays whole on every rank and runs as it is.
  for (const auto& layer : layers) {
    const std::string prefix = layer->name() + ".";
    if (std::none_of(params.begin(), params.end(),
                     [&](const auto& p) { return p.first.rfind(prefix, 0) == 0; }))
      whole_layers_.insert(layer.get());
  }
  // Everything is checked before any parameter changes.
  for (const auto& unit : members)
    for (const auto& [name, param] : unit) {
      if (param.scalar_type() != unit.front().second.scalar_type())
        throw ModelError(fmt::format("FSDP: {} is {} but {} is {}: a unit holds one dtype", name,
                                     c10::toString(param.scalar_type()), unit.front().first,
                                     c10::toString(unit.front().second.scalar_type())));
      if (!param.requires_grad() || !param.is_leaf())
        throw ModelError(fmt::format("FSDP: parameter {} is not a trainable leaf", name));
    }
  std::vector<int64_t> everyone(static_cast<size_t>(comm->size()));
  std::iota(everyone.begin(), everyone.end(), int64_t{0});
  gather_comm_ = comm->subgroup("fsdp-gather", everyone);
  reduce_comm_ = comm->subgroup("fsdp-reduce", everyone);

  at::NoGradGuard no_grad;
  for (size_t m = 0; m < members.size(); ++m) {
    if (m > 0 && members[m].empty()) continue;  // a frozen layer stays whole and runs directly
    auto unit = std::make_unique<Unit>();
    unit->name = m == 0 ? "root" : layers[m - 1]->name();
    std::vector<std::string> names;
    std::vector<at::Tensor> tensors;
    const at::ScalarType dtype = members[m].empty() ? at::kFloat : members[m].front().second.scalar_type();
    for (const auto& [name, param] : members[m]) {
      names.push_back(name);
      tensors.push_back(param);
    }
    unit->shard =
        std::make_shared<FlatShard>(std::move(names), tensors, gather_comm_->rank(), gather_comm_->size());
    // The parameters become views of the unit's whole buffer, then the buffer's memory is freed.
    unit->whole = at::zeros({unit->shard->padded_numel()},
                            at::TensorOptions().dtype(dtype).device(unit->shard->device()));
    for (size_t i = 0; i < tensors.size(); ++i) {
      at::Tensor view = unit->shard->unflatten(unit->whole, i);
      view.copy_(tensors[i].detach());
      at::Tensor param = tensors[i];
      param.set_data(view);
    }
    release_storage(unit->whole);
    unit->ready.assign(tensors.size(), false);
    const size_t u = units_.size();
    if (m > 0) unit_of_[layers[m - 1].get()] = u;
    for (size_t i = 0; i < tensors.size(); ++i) {
      auto accumulator = torch::autograd::impl::grad_accumulator(tensors[i]);
      hook_keys_.push_back(accumulator->add_post_hook(
          std::make_unique<dist::GradientReadyHook>([this, u, i] { on_gradient_ready(u, i); })));
      accumulators_.push_back(std::move(accumulator));
    }
    units_.push_back(std::move(unit));
  }
  for (size_t u = units_.size(); u-- > 1;) backward_gathers_.push_back(u);
  reductions_ = backward_gathers_;
  reductions_.push_back(0);
  reduce_thread_ = std::thread([this] { finish_reductions(); });
}

void FullyShardedModel::finish_reductions() {
  while (true) {
    size_t u = 0;
    {
      std::unique_lock<std::mutex> lock(queue_mutex_);
      queue_changed_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping, and nothing left
      u = queue_.front();
      queue_.pop_front();
      finishing_ = true;
    }
    Unit& unit = *units_[u];
    try {
      unit.reduce->wait();
      unit.shard->grad.add_(unit.reduced);
    } catch (...) {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (!reduce_error_) reduce_error_ = std::current_exception();
    }
    unit.reduce.reset();  // frees the buffers
    unit.reduced = at::Tensor();
    account(-unit.reduce_bytes);
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      finishing_ = false;
    }
    queue_changed_.notify_all();
  }
}

FullyShardedModel::~FullyShardedModel() {
  for (size_t k = 0; k < accumulators_.size(); ++k) accumulators_[k]->del_post_hook(hook_keys_[k]);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    stopping_ = true;
  }
  queue_changed_.notify_all();
  // After the reduce-scatters still queued (a pass an error cut short). These waits end: every
  // collective this rank started, the other ranks start too (they issue in the same order and only
  // ever wait on collectives they have issued), or they have died and it fails at once.
  reduce_thread_.join();
  for (auto& unit : units_) {
    try {  // let the gathers end before their buffers go
      if (unit->gather) unit->gather->wait();
    } catch (const std::exception&) {
    }
  }
}

void FullyShardedModel::account(int64_t bytes) {
  std::lock_guard<std::mutex> lock(account_mutex_);
  if (mode_ != Mode::pass) return;
  transient_ += bytes;
  peak_transient_ = std::max(peak_transient_, transient_);
}

void FullyShardedModel::start_gather(size_t u) {
  // Always a collective, even for a unit that is still whole here: every rank issues the same ones.
  Unit& unit = *units_[u];
  if (unit.gather) wait_gather(u);
  if (!unit.gathered) {
    allocate_storage(unit.whole);
    unit.gathered = true;
    account(static_cast<int64_t>(unit.whole.nbytes()));
  }
  const at::Tensor input = unit.whole.scalar_type() == at::kFloat
                               ? unit.shard->master
                               : unit.shard->master.to(unit.whole.scalar_type());
  unit.gather = gather_comm_->start_all_gather_flat(input, unit.whole);
  account(static_cast<int64_t>(unit.whole.nbytes()));  // Gloo gathers into a flat buffer of its own
}

void FullyShardedModel::wait_gather(size_t u) {
  Unit& unit = *units_[u];
  if (!unit.gather) return;
  auto work = std::move(unit.gather);
  work->wait();
  account(-static_cast<int64_t>(unit.whole.nbytes()));
}

void FullyShardedModel::free_unit(size_t u) {
  Unit& unit = *units_[u];
  wait_gather(u);  // never free memory a collective is writing
  if (!unit.gathered) return;
  release_storage(unit.whole);
  unit.gathered = false;
  account(-static_cast<int64_t>(unit.whole.nbytes()));
}

void FullyShardedModel::issue_forward_through(size_t position) {
  for (; forward_next_ <= position && forward_next_ < units_.size(); ++forward_next_)
    start_gather(forward_next_);
}

void FullyShardedModel::pass_over_forward_before(size_t u) {
  // Units before `u` whose forward this rank skipped (no images: no vision layer ran): their
  // gathers pair with the other ranks', one at a time, so no more than one is whole at once.
  for (; forward_next_ < u; ++forward_next_) {
    start_gather(forward_next_);
    free_unit(forward_next_);
  }
  for (size_t v = 1; v < u; ++v) free_unit(v);  // one gathered ahead that did not run either
}

void FullyShardedModel::issue_backward_through(size_t position) {
  for (; backward_next_ <= position && backward_next_ < backward_gathers_.size(); ++backward_next_)
    start_gather(backward_gathers_[backward_next_]);
}

void FullyShardedModel::begin_pass() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::sharded)
    throw ModelError(mode_ == Mode::pass ? "FSDP: a pass began before the previous one ended"
                                         : "FSDP: a pass began while every parameter was whole (gather_all)");
  mode_ = Mode::pass;
  forward_next_ = backward_next_ = reduce_next_ = 0;
  for (auto& unit : units_) {
    std::fill(unit->ready.begin(), unit->ready.end(), false);
    unit->waiting = unit->ready.size();
    unit->ready_bytes = 0;
  }
  issue_forward_through(1);  // the root unit, and the first layer unit's gather behind it
  wait_gather(0);
}

core::Carry FullyShardedModel::run(const core::Layer& layer, core::Carry carry,
                                   const std::function<core::Carry(core::Carry)>& next) {
  size_t u = 0;
  {
    std::lock_guard<std::recursive_mutex> lock(mutex_);
    const auto it = unit_of_.find(&layer);
    if (mode_ == Mode::gathered || mode_ == Mode::gathered_pass || whole_layers_.count(&layer) > 0)
      return next(std::move(carry));
    if (mode_ != Mode::pass)
      throw ModelError(
          fmt::format("FSDP: layer {} ran while the parameters were sharded (outside a pass or gather_all)",
                      layer.name()));
    if (it == unit_of_.end()) return next(std::move(carry));  // its parameters are the root unit's, gathered
    u = it->second;
    pass_over_forward_before(u);
    issue_forward_through(u + 1);  // this layer, and the next one's gather to overlap this compute
    wait_gather(u);
    if (!units_[u]->gathered)
      throw ModelError(fmt::format(
          "FSDP: layer {} ran twice in one pass (its weights are freed after it runs)", units_[u]->name));
  }
  std::set<const void*> inputs;
  for (const auto& [name, tensor] : carry.tensors()) inputs.insert(tensor.unsafeGetTensorImpl());
  core::Carry out = next(std::move(carry));
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  free_unit(u);
  // Backward reaches the layer when the gradient of what it made arrives.
  for (const auto& [name, tensor] : out.tensors())
    if (tensor.requires_grad() && inputs.count(tensor.unsafeGetTensorImpl()) == 0) {
      at::Tensor made = tensor;
      made.register_hook([this, u](const at::Tensor&) { before_backward(u); });
    }
  return out;
}

void FullyShardedModel::before_backward(size_t u) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::pass) return;
  const size_t position = units_.size() - 1 - u;  // layer units in reverse
  issue_backward_through(position + 1);           // and the unit backward reaches next
  wait_gather(u);
}

void FullyShardedModel::on_gradient_ready(size_t u, size_t param) {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  Unit& unit = *units_[u];
  if (mode_ != Mode::pass || unit.ready[param]) return;
  unit.ready[param] = true;
  --unit.waiting;
  const int64_t bytes = static_cast<int64_t>(unit.shard->params()[param].nbytes());
  unit.ready_bytes += bytes;
  account(bytes);
  start_ready_reductions();
}

void FullyShardedModel::start_ready_reductions() {
  while (reduce_next_ < reductions_.size() && units_[reductions_[reduce_next_]]->waiting == 0)
    start_reduce(reductions_[reduce_next_++]);
}

void FullyShardedModel::start_reduce(size_t u) {
  Unit& unit = *units_[u];
  std::vector<at::Tensor> grads;
  for (size_t i = 0; i < unit.shard->params().size(); ++i) {
    grads.push_back(unit.shard->params()[i].grad());
    if (grads.back().defined()) unit.shard->has_grad[i] = true;
  }
  at::Tensor send = unit.shard->flatten(grads, at::kFloat);  // zeros for gradients this rank lacks
  for (at::Tensor p : unit.shard->params()) p.mutable_grad() = at::Tensor();
  account(-unit.ready_bytes);
  unit.ready_bytes = 0;
  unit.reduce_bytes = 2 * static_cast<int64_t>(send.nbytes());  // and the all-to-all's receive buffer
  account(unit.reduce_bytes);
  unit.reduced = at::empty({unit.shard->slice_numel()}, send.options());
  unit.reduce = reduce_comm_->start_reduce_scatter_sum(send, unit.reduced);
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    queue_.push_back(u);
  }
  queue_changed_.notify_all();
  free_unit(u);  // every use of the whole parameters in this backward is behind us
}

double FullyShardedModel::end_pass() {
  const auto begin = std::chrono::steady_clock::now();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::pass) throw ModelError("FSDP: end_pass without begin_pass");
  // What this rank skipped, every other rank may have done, in the fixed orders: one unit at a
  // time (gathered and freed, or reduced and finished), so a rank that skipped much holds one
  // unit's buffers at once. Every gather is issued before any reduce-scatter is waited on here, so
  // no rank waits on a collective another has yet to reach.
  pass_over_forward_before(units_.size());
  for (; backward_next_ < backward_gathers_.size(); ++backward_next_) {
    start_gather(backward_gathers_[backward_next_]);
    free_unit(backward_gathers_[backward_next_]);
  }
  for (size_t u = 0; u < units_.size(); ++u) free_unit(u);
  while (reduce_next_ < reductions_.size()) {
    start_reduce(reductions_[reduce_next_++]);
    wait_for_reductions();
  }
  return finish_pass(begin);
}

void FullyShardedModel::begin_gathered_pass() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::sharded)
    throw ModelError("FSDP: a gathered pass began while a pass ran or all was gathered");
  for (size_t u = 0; u < units_.size(); ++u) start_gather(u);
  for (size_t u = 0; u < units_.size(); ++u) wait_gather(u);
  mode_ = Mode::gathered_pass;
}

double FullyShardedModel::end_gathered_pass() {
  const auto begin = std::chrono::steady_clock::now();
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::gathered_pass) throw ModelError("FSDP: end_gathered_pass without begin_gathered_pass");
  // Each unit's accumulated gradients reduce-scattered in the fixed order, its whole buffers freed.
  for (size_t u : reductions_) start_reduce(u);
  return finish_pass(begin);
}

// After a pass's reduce-scatters were started: waits for them, back to sharded.
double FullyShardedModel::finish_pass(const std::chrono::steady_clock::time_point& begin) {
  wait_for_reductions();
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    std::swap(error, reduce_error_);
  }
  mode_ = Mode::sharded;
  {
    std::lock_guard<std::mutex> account_lock(account_mutex_);
    transient_ = 0;
  }
  if (error) std::rethrow_exception(error);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
}

void FullyShardedModel::wait_for_reductions() {
  std::unique_lock<std::mutex> lock(queue_mutex_);
  queue_changed_.wait(lock, [&] { return queue_.empty() && !finishing_; });
}

void FullyShardedModel::gather_all() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::sharded) throw ModelError("FSDP: gather_all while a pass runs or already gathered");
  for (size_t u = 0; u < units_.size(); ++u) start_gather(u);
  for (size_t u = 0; u < units_.size(); ++u) wait_gather(u);
  mode_ = Mode::gathered;
}

void FullyShardedModel::release_all() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  for (size_t u = 0; u < units_.size(); ++u) free_unit(u);
  mode_ = Mode::sharded;
}

void FullyShardedModel::reshard_from_parameters() {
  std::lock_guard<std::recursive_mutex> lock(mutex_);
  if (mode_ != Mode::gathered) throw ModelError("FSDP: resharding needs the parameters whole (gather_all)");
  at::NoGradGuard no_grad;
  for (auto& unit : units_) {
    std::vector<at::Tensor> values;
    for (const at::Tensor& p : unit->shard->params()) values.push_back(p.detach());
    unit->shard->take_slice(values, unit->shard->master);
  }
}

std::vector<std::shared_ptr<FlatShard>> FullyShardedModel::shards() const {
  std::vector<std::shared_ptr<FlatShard>> out;
  for (const auto& unit : units_) out.push_back(unit->shard);
  return out;
}

std::vector<std::string> FullyShardedModel::unit_names() const {
  std::vector<std::string> out;
  for (const auto& unit : units_) out.push_back(unit->name);
  return out;
}

int64_t FullyShardedModel::shard_parameter_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) bytes += static_cast<int64_t>(unit->shard->master.nbytes());
  return bytes;
}

int64_t FullyShardedModel::shard_gradient_bytes() const {
  int64_t bytes = 0;
  for (const auto& unit : units_) bytes += static_cast<int64_t>(unit->shard->grad.nbytes());
  return bytes;
}

}  // namespace loom::parallel
