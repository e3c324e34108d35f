#include "loom/train/pipeline_placement.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <sstream>

#include "loom/models/weights.h"
#include "loom/parallel/pipeline/cut.h"
#include "loom/util/errors.h"
#include "loom/util/tensor_storage.h"

namespace loom::train {

PipelinePlacement::PipelinePlacement(core::Model& model, const config::JobConfig& job,
                                     std::shared_ptr<dist::Comm> pipeline)
    : comm_(std::move(pipeline)) {
  namespace pp = parallel::pipeline;
  const int64_t ranks = comm_->size(), rank = comm_->rank(), chunks = job.parallel.virtual_stages;
  const int64_t stages = ranks * chunks, last = stages - 1;
  const core::Layers layers = model.layers();
  const auto infos = pp::layer_infos(layers);
  const auto cut = pp::cut_stages(infos, stages, job.model.pipeline_layers);
  description_ = pp::describe_cut(infos, cut);
  std::vector<int64_t> stage_of(layers.size());
  fewest_blocks_ = static_cast<int64_t>(layers.size());
  for (int64_t s = 0; s < stages; ++s) {
    int64_t blocks = 0;
    for (size_t i = cut[s].begin; i < cut[s].end; ++i) {
      stage_of[i] = s;
      blocks += layers[i]->block() ? 1 : 0;
    }
    fewest_blocks_ = std::min(fewest_blocks_, blocks);
  }
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t s = c * ranks + rank;
    core::Stage chunk;
    chunk.layers.assign(layers.begin() + static_cast<std::ptrdiff_t>(cut[s].begin),
                        layers.begin() + static_cast<std::ptrdiff_t>(cut[s].end));
    chunk.first = s == 0;
    chunk.last = s == last;
    chunks_.push_back(std::move(chunk));
  }

  // The ranks holding each parameter, the first of them counting it.
  std::map<std::vector<int64_t>, std::vector<std::string>> shared;
  parameters_ = models::named_parameters(model.module());
  for (const auto& [name, tensor] : parameters_) {
    std::set<int64_t> holders;
    int64_t counting = last % ranks;
    for (size_t i = 0; i < layers.size(); ++i) {
      if (name.rfind(layers[i]->name() + ".", 0) != 0) continue;
      counting = stage_of[i] % ranks;
      holders.insert(counting);
      if (layers[i]->parameters_read_outside()) holders.insert(last % ranks);
      break;
    }
    if (holders.empty()) holders.insert(last % ranks);  // the task's head, on the last stage
    if (holders.count(rank)) {
      held_.insert(name);
      if (counting != rank) copies_.insert(name);
    }
    if (holders.size() > 1) shared[{holders.begin(), holders.end()}].push_back(name);
  }
  for (const auto& [members, names] : shared)
    if (std::find(members.begin(), members.end(), rank) != members.end())
      shared_.emplace_back(comm_->subgroup(fmt::format("shared.{}", fmt::join(members, "-")), members),
                           names);
  release();
}

void PipelinePlacement::sum_shared_gradients() {
  at::NoGradGuard no_grad;
  for (const auto& [group, names] : shared_) {
    std::vector<at::Tensor> grads;
    for (auto& [name, t] : parameters_) {
      if (std::find(names.begin(), names.end(), name) == names.end() || !t.requires_grad()) continue;
      if (!t.grad().defined()) t.mutable_grad() = at::zeros_like(t);
      grads.push_back(t.grad());
    }
    if (!grads.empty()) group->all_reduce_sum(grads);
  }
}

void PipelinePlacement::gather() {
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> sums;  // each parameter's value on the rank counting it, zeros elsewhere
  for (auto& [name, t] : parameters_) {
    if (copies_.count(name)) {
      sums.push_back(at::zeros_like(t));
    } else if (held_.count(name)) {
      sums.push_back(t);
    } else {
      if (t.storage().nbytes() == 0 && t.numel() > 0) allocate_storage(t);
      t.zero_();
      sums.push_back(t);
    }
  }
  comm_->all_reduce_sum(sums);
}

void PipelinePlacement::release() {
  for (const auto& [name, t] : parameters_)
    if (!held_.count(name) && owns_storage(t)) release_storage(t);
}

namespace {

class PipelinedOptimizer : public Optimizer {
 public:
  PipelinedOptimizer(std::unique_ptr<Optimizer> stages, std::shared_ptr<const PipelinePlacement> placement,
                     std::set<std::string> trainable)
      : stages_(std::move(stages)), placement_(std::move(placement)), trainable_(std::move(trainable)) {}

  void step(double lr) override { stages_->step(lr); }
  void skip_step() override { stages_->skip_step(); }

  std::vector<std::pair<std::string, at::Tensor>> state_dict() const override {
    // Each rank describes the entries it gives ("name dtype size..."), all learn every rank's, then one
    // sum makes them whole everywhere: each entry is its giver's value plus zeros.
    const auto mine = stages_->state_dict();
    dist::Comm& comm = *placement_->comm();
    std::string described;
    std::map<std::string, at::Tensor> given;
    for (const auto& [key, value] : mine) {
      if (key == "step" ? comm.rank() != 0 : !placement_->counts(parameter_of(key))) continue;
      described += fmt::format("{} {} {}\n", key, static_cast<int>(value.scalar_type()),
                               fmt::join(value.sizes(), " "));
      given.emplace(key, value.to(at::kCPU));  // checkpoint data: summed through the CPU
    }
    std::vector<std::pair<std::string, at::Tensor>> whole;
    std::vector<at::Tensor> sums;
    for (const std::string& text : comm.all_gather(described)) {
      std::istringstream lines(text);
      for (std::string line; std::getline(lines, line);) {
        std::istringstream in(line);
        std::string key;
        int dtype = 0;
        in >> key >> dtype;
        std::vector<int64_t> sizes;
        for (int64_t size; in >> size;) sizes.push_back(size);
        auto it = given.find(key);
        at::Tensor t = it != given.end()
                           ? it->second.clone()
                           : at::zeros(sizes, at::TensorOptions().dtype(static_cast<at::ScalarType>(dtype)));
        whole.emplace_back(key, t);
        sums.push_back(t);
      }
    }
    comm.all_reduce_sum(sums);
    return whole;
  }

  void load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) override {
    std::vector<std::pair<std::string, at::Tensor>> mine;
    for (const auto& [key, value] : state) {
      if (key == "step") {
        mine.emplace_back(key, value);
        continue;
      }
      const std::string name = parameter_of(key);
      if (!trainable_.count(name))
        throw CheckpointError(
            fmt::format("optimizer state: unexpected entry '{}' (no trainable parameter {})", key, name));
      if (placement_->holds(name)) mine.emplace_back(key, value);
    }
    stages_->load_state_dict(mine);
  }

 private:
  // "exp_avg.<name>" -> "<name>".
  static std::string parameter_of(const std::string& key) {
    const size_t dot = key.find('.');
    return dot == std::string::npos ? key : key.substr(dot + 1);
  }

  std::unique_ptr<Optimizer> stages_;
  std::shared_ptr<const PipelinePlacement> placement_;
  std::set<std::string> trainable_;
};

}  // namespace

std::unique_ptr<Optimizer> pipelined_optimizer(std::unique_ptr<Optimizer> stages,
                                               std::shared_ptr<const PipelinePlacement> placement,
                                               std::set<std::string> trainable) {
  return std::make_unique<PipelinedOptimizer>(std::move(stages), std::move(placement), std::move(trainable));
}

}  // namespace loom::train
