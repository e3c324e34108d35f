#include "loom/parallel/pipeline/cut.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <limits>

#include "loom/util/errors.h"

namespace loom::parallel::pipeline {
namespace {

constexpr const char* kKey = "model.pipeline_layers";

// The stage of each block (in layer order) from the per-tower lists, checked.
std::vector<int64_t> listed_stages(const std::vector<LayerInfo>& layers,
                                   const std::vector<std::string>& towers,
                                   const std::map<std::string, int64_t>& blocks, int64_t stages,
                                   const std::map<std::string, std::vector<int64_t>>& per_tower) {
  for (const auto& [tower, list] : per_tower)
    if (!blocks.count(tower))
      throw ConfigError(fmt::format("{}.{}: the model has no tower {} (its towers: {})", kKey, tower, tower,
                                    fmt::join(towers, ", ")));
  for (const auto& tower : towers) {
    auto it = per_tower.find(tower);
    if (it == per_tower.end())
      throw ConfigError(fmt::format("{}: no list for the tower {} (give one for each of {})", kKey, tower,
                                    fmt::join(towers, ", ")));
    const auto& list = it->second;
    if (static_cast<int64_t>(list.size()) != stages)
      throw ConfigError(
          fmt::format("{}.{}: {} entries for {} pipeline stages (parallel.pp x parallel.virtual_stages; one "
                      "entry per stage, "
                      "chunk-major: chunk 0 of every rank, then chunk 1, ...)",
                      kKey, tower, list.size(), stages));
    int64_t sum = 0;
    for (size_t s = 0; s < list.size(); ++s) {
      if (list[s] < 0)
        throw ConfigError(
            fmt::format("{}.{}: entry {} is {}; a stage holds 0 or more blocks", kKey, tower, s, list[s]));
      sum += list[s];
    }
    if (sum != blocks.at(tower))
      throw ConfigError(fmt::format("{}.{}: [{}] sums to {}, but the model has {} {} blocks", kKey, tower,
                                    fmt::join(list, ", "), sum, blocks.at(tower), tower));
  }
  for (int64_t s = 0; s < stages; ++s) {
    int64_t held = 0;
    for (const auto& tower : towers) held += per_tower.at(tower)[s];
    if (held == 0)
      throw ConfigError(fmt::format("{}: stage {} holds no blocks of any tower ({}); every stage needs one",
                                    kKey, s, fmt::join(towers, ", ")));
  }
  std::vector<int64_t> stage_of;
  std::map<std::string, int64_t> seen;  // blocks of each tower met so far
  std::string last_tower;
  for (const LayerInfo& layer : layers) {
    if (!layer.block) continue;
    const auto& list = per_tower.at(layer.tower);
    int64_t index = seen[layer.tower]++, s = 0;
    while (index >= list[s]) index -= list[s++];
    if (!stage_of.empty() && s < stage_of.back())
      throw ConfigError(fmt::format(
          "{}: {} blocks on stage {} would run before {} blocks on stage {}, but the model runs {} before {} "
          "(a later tower takes the same or later stages)",
          kKey, layer.tower, s, last_tower, stage_of.back(), last_tower, layer.tower));
    stage_of.push_back(s);
    last_tower = layer.tower;
  }
  return stage_of;
}

// The stage of each block: `stages` contiguous, non-empty runs whose largest summed cost is the least
// possible (on a tie, the later cut: the last stage also holds the head and the loss).
std::vector<int64_t> balanced_stages(const std::vector<double>& costs, int64_t stages) {
  const size_t n = costs.size(), k_max = static_cast<size_t>(stages);
  std::vector<double> prefix(n + 1, 0.0);
  for (size_t i = 0; i < n; ++i) prefix[i + 1] = prefix[i] + costs[i];
  constexpr double kNone = std::numeric_limits<double>::infinity();
  // best[k][j]: the least largest run over the first j blocks in k runs; cut[k][j]: where the last begins.
  std::vector<std::vector<double>> best(k_max + 1, std::vector<double>(n + 1, kNone));
  std::vector<std::vector<size_t>> cut(k_max + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0.0;
  for (size_t k = 1; k <= k_max; ++k)
    for (size_t j = k; j <= n; ++j)
      for (size_t i = k - 1; i < j; ++i) {
        const double worst = std::max(best[k - 1][i], prefix[j] - prefix[i]);
        if (worst <= best[k][j]) best[k][j] = worst, cut[k][j] = i;
      }
  std::vector<int64_t> stage_of(n);
  for (size_t k = k_max, j = n; k > 0; --k) {
    const size_t i = cut[k][j];
    for (size_t b = i; b < j; ++b) stage_of[b] = static_cast<int64_t>(k - 1);
    j = i;
  }
  return stage_of;
}

}  // namespace

std::vector<LayerInfo> layer_infos(const core::Layers& layers) {
  std::vector<LayerInfo> infos;
  for (const auto& layer : layers) {
    LayerInfo info{layer->name(), layer->tower(), layer->block(), 0.0};
    if (info.block)
      for (const auto& p : layer->module().parameters()) info.cost += static_cast<double>(p.numel());
    infos.push_back(std::move(info));
  }
  return infos;
}

std::vector<LayerRange> cut_stages(const std::vector<LayerInfo>& layers, int64_t stages,
                                   const std::map<std::string, std::vector<int64_t>>& per_tower) {
  if (stages < 1) throw ModelError(fmt::format("cutting a model into {} pipeline stages", stages));
  std::vector<std::string> towers;
  std::map<std::string, int64_t> blocks;
  std::vector<double> costs;
  for (const LayerInfo& layer : layers) {
    if (layer.tower.empty())
      throw ConfigError(fmt::format(
          "parallel.pp: the model's layer {} belongs to no tower; this model is not cut into pipeline stages",
          layer.name));
    if (!blocks.count(layer.tower)) towers.push_back(layer.tower);
    blocks[layer.tower] += layer.block ? 1 : 0;
    if (layer.block) costs.push_back(layer.cost);
  }
  for (const auto& tower : towers)
    if (blocks[tower] == 0 && stages > 1)
      throw ConfigError(fmt::format("parallel.pp: the model's tower {} has no blocks to cut", tower));
  std::vector<int64_t> block_stage;
  if (!per_tower.empty()) {
    block_stage = listed_stages(layers, towers, blocks, stages, per_tower);
  } else {
    if (static_cast<int64_t>(costs.size()) < stages)
      throw ConfigError(
          fmt::format("parallel.pp x parallel.virtual_stages = {} pipeline stages, but the model has {} "
                      "blocks; every stage "
                      "needs at least one",
                      stages, costs.size()));
    block_stage = balanced_stages(costs, stages);
  }
  // Every layer's stage: a block's own; any other layer's that of its tower's first block when it comes
  // before it, otherwise that of its tower's block before it.
  std::vector<int64_t> stage_of(layers.size(), -1);
  std::map<std::string, int64_t> first_stage, previous_stage;
  for (size_t i = 0, b = 0; i < layers.size(); ++i)
    if (layers[i].block) {
      stage_of[i] = block_stage[b++];
      first_stage.emplace(layers[i].tower, stage_of[i]);
    }
  for (size_t i = 0; i < layers.size(); ++i) {
    const std::string& tower = layers[i].tower;
    if (layers[i].block) {
      previous_stage[tower] = stage_of[i];
    } else if (previous_stage.count(tower)) {
      stage_of[i] = previous_stage[tower];
    } else {
      stage_of[i] = first_stage.count(tower) ? first_stage[tower] : 0;
    }
  }
  std::vector<LayerRange> ranges(static_cast<size_t>(stages));
  for (size_t i = 0; i < layers.size(); ++i) {
    if (i > 0 && stage_of[i] < stage_of[i - 1])
      throw ModelError(fmt::format("pipeline cut: layer {} on stage {} after layer {} on stage {}",
                                   layers[i].name, stage_of[i], layers[i - 1].name, stage_of[i - 1]));
    LayerRange& range = ranges[static_cast<size_t>(stage_of[i])];
    if (range.end == range.begin) range.begin = i;
    range.end = i + 1;
  }
  return ranges;
}

std::string describe_cut(const std::vector<LayerInfo>& layers, const std::vector<LayerRange>& cut) {
  std::vector<std::string> towers;
  std::map<std::string, std::vector<int64_t>> counts;
  for (size_t s = 0; s < cut.size(); ++s)
    for (size_t i = cut[s].begin; i < cut[s].end; ++i) {
      auto& list = counts[layers[i].tower];
      if (list.empty()) {
        towers.push_back(layers[i].tower);
        list.assign(cut.size(), 0);
      }
      list[s] += layers[i].block ? 1 : 0;
    }
  std::string out;
  for (const auto& tower : towers)
    out += fmt::format("{}{}: [{}]", out.empty() ? "" : ", ", tower, fmt::join(counts[tower], ", "));
  return fmt::format("{}: {{{}}}", kKey, out);
}

}  // namespace loom::parallel::pipeline
