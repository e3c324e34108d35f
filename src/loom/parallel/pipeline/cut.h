// Cutting a model's layers into pipeline stages. A model's layers come in towers (a vision-language
// model: its vision tower, e.g. `visual`, then the LLM `llm`; a DiT: `dit`), each a run of repeated blocks
// with a few other layers around them (patch embedding, merger, token embedding, final norm). A stage is a
// contiguous run of layers: model.pipeline_layers gives, per tower, how many of its blocks each global stage
// holds (MindSpeed MM's per-tower lists); a layer that is not a block goes with its tower's nearest block:
// before the tower's first block, with that block (the token embedding and the image scatter go to the first
// stage holding LLM blocks), otherwise with the block before it (the merger with the last vision block, the
// final norm with the last LLM block). Without lists, the blocks are split into contiguous runs whose largest
// estimated cost (parameter count) is the least possible.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "loom/core/layer.h"

namespace loom::parallel::pipeline {

// [begin, end) of the model's layers.
struct LayerRange {
  size_t begin = 0, end = 0;
  bool operator==(const LayerRange& other) const { return begin == other.begin && end == other.end; }
};

// What the cut reads of each layer (core::Layer gives it; tests write it by hand).
struct LayerInfo {
  std::string name, tower;
  bool block = false;
  double cost = 0;  // blocks only: the default split balances it
};

std::vector<LayerInfo> layer_infos(const core::Layers& layers);

// The layers of each of `stages` global stages (parallel.pp x parallel.virtual_stages), in order.
// `per_tower`: model.pipeline_layers (empty: the default split). ConfigError naming the key for a
// list of the wrong length or sum, an unknown or missing tower, a stage holding no block, or towers
// out of order (an LLM block on a stage before a vision block's).
std::vector<LayerRange> cut_stages(const std::vector<LayerInfo>& layers, int64_t stages,
                                   const std::map<std::string, std::vector<int64_t>>& per_tower);

// "model.pipeline_layers: {visual: [2, 0], llm: [1, 3]}" for the cut made, for the log.
std::string describe_cut(const std::vector<LayerInfo>& layers, const std::vector<LayerRange>& cut);

}  // namespace loom::parallel::pipeline
