#include "loom/tasks/vlm_sft/generate.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>

#include "loom/tasks/vlm_sft/job_data.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::tasks {

namespace {

constexpr uint64_t kSamplingStream = 0x5a4d504c;  // the counter-based stream of sampling draws

// A uniform draw in [0, 1) from 53 random bits.
double uniform(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// One row's sampled token: the logits at the temperature, cut to the top_k most likely and of
// those to the fewest whose probabilities reach top_p (the most likely always kept), renormalised,
// and drawn by inverse CDF with u.
int64_t sample_row(const at::Tensor& logits, const SamplingOptions& options, double u) {
  const at::Tensor scaled = logits.to(at::kDouble) / options.temperature;
  const int64_t vocab = scaled.size(0);
  const int64_t k = options.top_k > 0 ? std::min(options.top_k, vocab) : vocab;
  const auto [values, indices] = scaled.topk(k);  // descending
  const at::Tensor probs = at::softmax(values, 0).cpu().contiguous();
  const at::Tensor ids = indices.cpu().contiguous();
  const double* p = probs.data_ptr<double>();
  int64_t kept = 0;
  double mass = 0;
  while (kept < k && (kept == 0 || mass < options.top_p)) mass += p[kept++];
  double target = u * mass, cumulative = 0;
  for (int64_t i = 0; i < kept; ++i) {
    cumulative += p[i];
    if (target < cumulative) return ids.data_ptr<int64_t>()[i];
  }
  return ids.data_ptr<int64_t>()[kept - 1];
}

}  // namespace

void check_sampling(const SamplingOptions& options) {
  if (options.max_new_tokens < 1)
    throw ConfigError(fmt::format("--max-new-tokens: {} is not >= 1", options.max_new_tokens));
  if (!(options.temperature >= 0) || !std::isfinite(options.temperature))
    throw ConfigError(fmt::format("--temperature: {} is not >= 0 (0 = greedy)", options.temperature));
  if (options.top_k < 0) throw ConfigError(fmt::format("--top-k: {} is not >= 0 (0 = all)", options.top_k));
  if (!(options.top_p > 0 && options.top_p <= 1))
    throw ConfigError(fmt::format("--top-p: {} is not in (0, 1]", options.top_p));
}

std::vector<int64_t> pick_tokens(const at::Tensor& logits, const SamplingOptions& options, int64_t step) {
  const int64_t rows = logits.size(0);
  std::vector<int64_t> out(static_cast<size_t>(rows));
  if (options.temperature == 0) {
    const at::Tensor best = logits.argmax(-1).cpu().contiguous();
    std::copy_n(best.data_ptr<int64_t>(), rows, out.begin());
    return out;
  }
  for (int64_t r = 0; r < rows; ++r) {
    CounterRng rng(options.seed, kSamplingStream + options.first_row + static_cast<uint64_t>(r),
                   static_cast<uint64_t>(step));
    out[static_cast<size_t>(r)] = sample_row(logits[r], options, uniform(rng.next()));
  }
  return out;
}

GenerationTokens generation_tokens(const data::Tokenizer& tokenizer) {
  return {padding_id(tokenizer), stop_ids(tokenizer), tokenizer.vocab_size()};
}

models::VisionLanguageInputs left_padded(const data::Batch& batch, int64_t pad_id) {
  if (batch.packed()) throw ModelError("generation prompts come one per row, not packed");
  const int64_t rows = batch.input_ids.size(0), length = batch.input_ids.size(1);
  const std::vector<int64_t> lengths = batch.sequence_lengths();
  auto ids = at::full({rows, length}, pad_id, at::kLong);
  auto mask = at::zeros({rows, length}, at::kLong);
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t n = lengths[static_cast<size_t>(r)];
    ids[r].narrow(0, length - n, n).copy_(batch.input_ids[r].narrow(0, 0, n));
    mask[r].narrow(0, length - n, n).fill_(1);
  }
  models::VisionLanguageInputs in;
  in.input_ids = ids;
  in.attention_mask = mask;
  in.pixel_values = batch.pixel_values;
  in.image_grid_thw = batch.image_grid_thw;
  in.pixel_values_videos = batch.pixel_values_videos;
  in.video_grid_thw = batch.video_grid_thw;
  in.second_per_grid_ts = batch.second_per_grid_ts;
  return in;
}

Generated generate(const models::VisionLanguageModel& model, const data::Batch& prompts,
                   const GenerationTokens& tokens, const SamplingOptions& options,
                   const std::function<void(int64_t row, int64_t token)>& on_token) {
  check_sampling(options);
  const int64_t pad_id = tokens.pad;
  const std::vector<int64_t>& stop_ids = tokens.stops;
  // Ids past the tokenizer's (a padded vocabulary) are never chosen: they decode to nothing.
  const auto usable = [&tokens](at::Tensor logits) {
    if (tokens.vocab > 0 && tokens.vocab < logits.size(-1))
      logits.narrow(-1, tokens.vocab, logits.size(-1) - tokens.vocab)
          .fill_(-std::numeric_limits<float>::infinity());
    return logits;
  };
  at::NoGradGuard no_grad;
  const int64_t rows = prompts.input_ids.size(0);
  Generated out;
  out.tokens.resize(static_cast<size_t>(rows));
  out.finished.assign(static_cast<size_t>(rows), false);
  const std::unique_ptr<models::VisionLanguageDecoder> decoder = model.decoder();
  at::Tensor logits = usable(decoder->prefill(left_padded(prompts, pad_id)));
  for (int64_t step = 0; step < options.max_new_tokens; ++step) {
    const std::vector<int64_t> picked = pick_tokens(logits, options, step);
    bool all_done = true;
    std::vector<int64_t> fed(picked);
    for (int64_t r = 0; r < rows; ++r) {
      const size_t row = static_cast<size_t>(r);
      if (out.finished[row]) {
        fed[row] = pad_id;  // a finished row keeps decoding padding nobody reads
        continue;
      }
      if (std::find(stop_ids.begin(), stop_ids.end(), picked[row]) != stop_ids.end()) {
        out.finished[row] = true;
        fed[row] = pad_id;
        continue;
      }
      out.tokens[row].push_back(picked[row]);
      if (on_token) on_token(r, picked[row]);
      all_done = false;
    }
    if (all_done || step + 1 == options.max_new_tokens) break;
    logits = usable(decoder->step(at::tensor(fed, at::kLong)));
  }
  return out;
}

}  // namespace loom::tasks
