#include "loom/models/weights.h"

#include <ATen/CPUGeneratorImpl.h>
#include <spdlog/spdlog.h>

#include <filesystem>
#include <set>

#include "loom/checkpoint/safetensors.h"
#include "loom/parallel/tensor.h"
#include "loom/util/errors.h"

namespace loom::models {

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

bool is_norm(const std::string& name) {
  for (const char* part : {"norm", "ln_q", "layernorm"})
    if (name.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

uint64_t derive_seed(uint64_t seed, const std::string& purpose) {
  uint64_t h = 1469598103934665603ULL ^ seed;
  for (unsigned char c : purpose) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

std::vector<std::pair<std::string, at::Tensor>> named_parameters(const torch::nn::Module& module) {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& item : module.named_parameters(/*recurse=*/true))
    out.emplace_back(item.key(), item.value());
  return out;
}

int64_t parameter_count(const torch::nn::Module& module, bool trainable_only) {
  const auto layouts = parallel::shard_layouts(module);
  int64_t total = 0;
  for (const auto& [name, param] : named_parameters(module)) {
    if (trainable_only && !param.requires_grad()) continue;
    const auto it = layouts.find(name);
    const std::vector<int64_t> whole =
        it == layouts.end() ? param.sizes().vec() : it->second.whole_shape(param.sizes());
    int64_t count = 1;
    for (int64_t d : whole) count *= d;
    total += count;
  }
  return total;
}

std::vector<std::pair<std::string, at::Tensor>> whole_named_parameters(const torch::nn::Module& module) {
  const auto layouts = parallel::shard_layouts(module);
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (auto& [name, param] : named_parameters(module)) {
    auto it = layouts.find(name);
    out.emplace_back(name, it == layouts.end() ? param : it->second.gather(param.detach()));
  }
  return out;
}

void init_parameters(torch::nn::Module& module, uint64_t seed, double std) {
  at::NoGradGuard no_grad;
  const auto layouts = parallel::shard_layouts(module);
  for (auto& [name, param] : named_parameters(module)) {
    if (param.is_meta()) continue;
    if (ends_with(name, ".bias")) {
      param.zero_();
    } else if (is_norm(name) && param.dim() == 1) {
      param.fill_(1.0);
    } else {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(derive_seed(seed, "init/" + name));
      auto it = layouts.find(name);
      auto values = at::empty(
          it == layouts.end() ? param.sizes().vec() : it->second.whole_shape(param.sizes()), at::kFloat);
      values.normal_(0.0, std, generator);
      param.copy_(it == layouts.end() ? values : it->second.slice(values));
    }
  }
}

void load_parameters(torch::nn::Module& module, const std::string& model_dir) {
  load_parameters(module, model_dir, [](const std::string& parameter) { return FileTensor{parameter}; });
}

void load_parameters(torch::nn::Module& module, const std::string& model_dir,
                     const std::function<FileTensor(const std::string& parameter)>& locate) {
  load_parameters(module, model_dir, locate, [](const std::string&) { return false; });
}

int64_t load_parameters(torch::nn::Module& module, const std::string& model_dir,
                        const std::function<FileTensor(const std::string& parameter)>& locate,
                        const std::function<bool(const std::string& tensor)>& skip) {
  checkpoint::WeightSource source(model_dir);
  std::set<std::string> unused;
  int64_t skipped = 0;
  for (const auto& name : source.names()) {
    if (skip(name))
      ++skipped;
    else
      unused.insert(name);
  }
  at::NoGradGuard no_grad;
  const auto layouts = parallel::shard_layouts(module);
  for (auto& [parameter, param] : named_parameters(module)) {
    const FileTensor at = locate(parameter);
    const std::string& name = at.name;
    if (at.optional && at.stacked.empty() && !source.contains(name)) continue;
    auto layout = layouts.find(parameter);
    const std::vector<int64_t> whole =
        layout == layouts.end() ? param.sizes().vec() : layout->second.whole_shape(param.sizes());
    if (!at.stacked.empty()) {
      std::vector<at::Tensor> items;
      for (const auto& parts : at.stacked) {
        std::vector<at::Tensor> pieces;
        for (const std::string& part : parts) {
          if (!source.contains(part))
            throw CheckpointError(fmt::format("{}: tensor '{}' is missing (part of the model's '{}')",
                                              model_dir, part, parameter));
          if (!checkpoint::loadable_as(source.dtype(part), param.scalar_type()))
            throw CheckpointError(
                fmt::format("{}: tensor '{}' is stored as {}, which cannot load into the model's "
                            "{} parameter",
                            source.file_of(part), part, c10::toString(source.dtype(part)),
                            c10::toString(param.scalar_type())));
          pieces.push_back(source.load(part));
          unused.erase(part);
        }
        items.push_back(at::cat(pieces, 0));
      }
      const at::Tensor values = at::stack(items);
      if (values.sizes().vec() != whole)
        throw CheckpointError(fmt::format(
            "{}: the tensors '{}' ... make [{}], the model's '{}' is [{}]", model_dir,
            at.stacked.front().front(), fmt::join(values.sizes(), ", "), parameter, fmt::join(whole, ", ")));
      param.copy_(layout == layouts.end() ? values : layout->second.slice(values));
      continue;
    }
    if (!source.contains(name))
      throw CheckpointError(fmt::format("{}: tensor '{}' is missing (the model has it with shape {})",
                                        model_dir, name, fmt::join(whole, "x")));
    auto shape = source.shape(name);
    if (at.end > 0) {
      if (shape.empty() || at.end > shape[0])
        throw CheckpointError(fmt::format("{}: tensor '{}' has shape [{}], without the rows [{}, {}) of '{}'",
                                          model_dir, name, fmt::join(shape, ", "), at.begin, at.end,
                                          parameter));
      shape[0] = at.end - at.begin;
    }
    if (shape != whole)
      throw CheckpointError(fmt::format("{}: tensor '{}'{} has shape [{}], the model expects [{}]", model_dir,
                                        name,
                                        at.end > 0 ? fmt::format(" rows [{}, {})", at.begin, at.end) : "",
                                        fmt::join(shape, ", "), fmt::join(whole, ", ")));
    if (!checkpoint::loadable_as(source.dtype(name), param.scalar_type()))
      throw CheckpointError(fmt::format(
          "{}: tensor '{}' is stored as {}, which cannot load into the model's {} "
          "parameter (a mislabelled or foreign tensor)",
          source.file_of(name), name, c10::toString(source.dtype(name)), c10::toString(param.scalar_type())));
    auto values = source.load(name);
    if (at.end > 0) values = values.narrow(0, at.begin, at.end - at.begin);
    param.copy_(layout == layouts.end() ? values : layout->second.slice(values));
    unused.erase(name);
  }
  // Tied models may still ship a copy of their head.
  for (auto it = unused.begin(); it != unused.end();)
    it = it->size() >= 14 && it->compare(it->size() - 14, 14, "lm_head.weight") == 0 ? unused.erase(it)
                                                                                     : std::next(it);
  if (!unused.empty())
    throw CheckpointError(fmt::format("{}: tensor '{}' does not belong to this model ({} unexpected tensors)",
                                      model_dir, *unused.begin(), unused.size()));
  spdlog::info("loaded {} tensors from {}", named_parameters(module).size(), model_dir);
  return skipped;
}

}  // namespace loom::models
