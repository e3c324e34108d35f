#include "loom/data/batching.h"

#include <algorithm>
#include <numeric>

#include "loom/util/errors.h"

namespace loom::data {

SampleCost cost_of(const TokenizedExample& example) {
  SampleCost cost;
  cost.tokens = static_cast<int64_t>(example.input_ids.size());
  for (const auto* items : {&example.images, &example.videos})
    for (const VisionInput& item : *items)
      cost.patches += item.grid_thw[0] * item.grid_thw[1] * item.grid_thw[2];
  return cost;
}

bool truncate_example(TokenizedExample& example, int64_t max_len, int64_t vision_start_id,
                      int64_t vision_end_id, int64_t video_pad_id) {
  const auto& ids = example.input_ids;
  if (static_cast<int64_t>(ids.size()) <= max_len) return false;
  int64_t cut = std::max<int64_t>(max_len, 0);
  size_t kept_images = 0, kept_videos = 0;
  // A video of several blocks being read: the blocks seen, and where its first began.
  int64_t video_blocks = 0, video_begin = 0;
  for (int64_t i = 0; i < cut; ++i) {
    if (ids[i] != vision_start_id) continue;
    const auto end = std::find(ids.begin() + i, ids.end(), vision_end_id);
    if (end - ids.begin() >= cut) {  // the block does not end before the cut: it goes whole
      cut = i;
      break;
    }
    if (i + 1 < cut && ids[i + 1] == video_pad_id) {
      // One block for the video, or one per temporal patch.
      const VisionInput& video = example.videos.at(kept_videos);
      const int64_t pads = end - ids.begin() - i - 1;
      const int64_t blocks = pads == video.tokens ? 1 : video.grid_thw[0];
      if (video_blocks == 0) video_begin = i;
      if (++video_blocks == blocks) {
        ++kept_videos;
        video_blocks = 0;
      }
    } else {
      ++kept_images;
    }
    i = end - ids.begin();
  }
  if (video_blocks > 0) cut = std::min(cut, video_begin);  // a video split by the cut goes whole
  example.input_ids.resize(cut);
  example.labels.resize(cut);
  if (example.images.size() > kept_images) example.images.resize(kept_images);
  if (example.videos.size() > kept_videos) example.videos.resize(kept_videos);
  return true;
}

std::vector<std::vector<size_t>> balance_across_ranks(const std::vector<SampleCost>& costs, int64_t ranks) {
  const size_t n = costs.size();
  if (ranks < 1 || n < static_cast<size_t>(ranks))
    throw DataError(
        fmt::format("cannot split {} samples across {} data-parallel ranks: each needs one", n, ranks));
  auto room = [&](size_t r) { return n / ranks + (r < n % ranks ? 1 : 0); };
  double total_tokens = 0, total_patches = 0;
  for (const SampleCost& c : costs) {
    total_tokens += static_cast<double>(c.tokens);
    total_patches += static_cast<double>(c.patches);
  }
  // Loads as shares of a rank's fair part; a resource nothing uses counts as zero.
  const double token_unit = total_tokens > 0 ? total_tokens / ranks : 1.0;
  const double patch_unit = total_patches > 0 ? total_patches / ranks : 1.0;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  auto weight = [&](size_t i) { return costs[i].tokens / token_unit + costs[i].patches / patch_unit; };
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return weight(a) > weight(b); });

  std::vector<std::vector<size_t>> assigned(static_cast<size_t>(ranks));
  std::vector<double> tokens(static_cast<size_t>(ranks), 0.0), patches(static_cast<size_t>(ranks), 0.0);
  for (size_t i : order) {
    size_t best = 0;
    double best_load = 0;
    bool found = false;
    for (size_t r = 0; r < assigned.size(); ++r) {
      if (assigned[r].size() == room(r)) continue;
      const double load =
          std::max((tokens[r] + costs[i].tokens) / token_unit, (patches[r] + costs[i].patches) / patch_unit);
      if (!found || load < best_load) {
        best = r;
        best_load = load;
        found = true;
      }
    }
    assigned[best].push_back(i);
    tokens[best] += static_cast<double>(costs[i].tokens);
    patches[best] += static_cast<double>(costs[i].patches);
  }
  for (auto& items : assigned) std::sort(items.begin(), items.end());
  return assigned;
}

int64_t context_degree(const std::vector<int64_t>& lengths, int64_t data_parallel, int64_t cp,
                       int64_t budget) {
  const int64_t longest = lengths.empty() ? 0 : *std::max_element(lengths.begin(), lengths.end());
  if (longest > cp * budget) return 0;
  const int64_t samples = static_cast<int64_t>(lengths.size());
  for (int64_t d = 1; d < cp; ++d)
    if (cp % d == 0 && longest <= d * budget && samples >= data_parallel * cp / d) return d;
  return cp;
}

std::vector<Batch> rank_micro_batches(std::vector<TokenizedExample> step_samples,
                                      const MicroBatching& options) {
  if (options.ranks < 1 || options.rank < 0 || options.rank >= options.ranks)
    throw DataError(fmt::format("data-parallel rank {} is not one of {} ranks", options.rank, options.ranks));
  std::vector<SampleCost> costs;
  costs.reserve(step_samples.size());
  for (const TokenizedExample& ex : step_samples) costs.push_back(cost_of(ex));
  std::vector<TokenizedExample> mine;
  const auto shares = balance_across_ranks(costs, options.ranks);
  for (size_t i : shares[static_cast<size_t>(options.rank)]) mine.push_back(std::move(step_samples[i]));
  if (mine.empty()) return {};  // fewer usable samples than ranks: this rank sits the step out
  return make_micro_batches(std::move(mine), options);
}

std::vector<Batch> make_micro_batches(std::vector<TokenizedExample> examples, const MicroBatching& options) {
  const int64_t n = static_cast<int64_t>(examples.size());
  if (options.micro_batch_size < 1 || n == 0)
    throw DataError(
        fmt::format("cannot cut {} samples into micro-batches of {}", n, options.micro_batch_size));
  std::stable_sort(examples.begin(), examples.end(),
                   [](const TokenizedExample& a, const TokenizedExample& b) {
                     return a.input_ids.size() > b.input_ids.size();
                   });
  std::vector<Batch> batches;
  for (int64_t begin = 0; begin < n; begin += options.micro_batch_size) {
    const int64_t end = std::min(n, begin + options.micro_batch_size);
    std::vector<TokenizedExample> part(std::make_move_iterator(examples.begin() + begin),
                                       std::make_move_iterator(examples.begin() + end));
    batches.push_back(options.packing ? pack(part) : collate(part, options.pad_id));
  }
  return batches;
}

}  // namespace loom::data
