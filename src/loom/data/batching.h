// How the samples of one training step become micro-batches: split across data-parallel ranks so
// every rank gets about the same LLM tokens and vision patches, grouped by length so a
// micro-batch holds samples of like length, then padded into rows or packed into one row.
#pragma once
#include <cstdint>
#include <vector>

#include "loom/data/example.h"

namespace loom::data {

struct SampleCost {
  int64_t tokens = 0;   // LLM tokens, image pads included
  int64_t patches = 0;  // vision patches (rows of pixel_values) of all its images and videos
};

SampleCost cost_of(const TokenizedExample& example);

// Cuts an example to at most max_len tokens without splitting an image: when the cut falls inside
// a <|vision_start|> ... <|vision_end|> block, it moves to before the block, and the images (and
// videos: blocks whose first pad is video_pad_id) of removed blocks go too. A video written as a block
// per temporal patch (each after its time) stays whole or goes whole: the cut moves to before its
// first block (its first time's text is then the example's last). Labels are cut with the ids.
// Returns false (example unchanged) when it already fits.
bool truncate_example(TokenizedExample& example, int64_t max_len, int64_t vision_start_id,
                      int64_t vision_end_id, int64_t video_pad_id = -1);

// Splits n items among `ranks` data-parallel ranks, n / ranks each, the first n % ranks ranks one
// more (DataError when a rank would get none), balancing tokens and patches together. Items are taken by
// decreasing share of all tokens plus share of all patches (ties: lower index first); each goes to the rank
// with room whose larger relative load, tokens or patches, is lowest after taking it (ties: lower rank).
// Every rank's item indices come back in increasing order. Deterministic.
std::vector<std::vector<size_t>> balance_across_ranks(const std::vector<SampleCost>& costs, int64_t ranks);

// Dynamic context parallelism's degree for a step whose samples hold `lengths` tokens, over
// data_parallel x cp ranks: the smallest divisor d of cp whose d ranks hold the longest sample within
// `budget` tokens each and whose data_parallel x cp / d groups of d ranks each get a sample (cp when
// none does); 0 when cp ranks cannot hold the longest within the budget.
int64_t context_degree(const std::vector<int64_t>& lengths, int64_t data_parallel, int64_t cp,
                       int64_t budget);

struct MicroBatching {
  int64_t micro_batch_size = 1;  // samples per micro-batch
  bool packing = false;          // pack() each micro-batch instead of collate()
  int64_t pad_id = 0;            // padding token of collated rows
  int64_t rank = 0, ranks = 1;   // this data-parallel rank, of how many
};

// One step's samples on data-parallel rank options.rank: its share by balance_across_ranks, cut
// into micro-batches by make_micro_batches; none when the step has fewer samples than ranks.
std::vector<Batch> rank_micro_batches(std::vector<TokenizedExample> step_samples,
                                      const MicroBatching& options);

// Cuts one rank's samples of a step into micro-batches of micro_batch_size, the last one smaller
// when it does not divide their number (samples dropped as over-long): longest first (stable for
// equal lengths), so each micro-batch holds samples of like length and pads little. DataError for
// no samples. The loss is normalised over the whole step, so this
// grouping does not change what the step computes.
std::vector<Batch> make_micro_batches(std::vector<TokenizedExample> examples, const MicroBatching& options);

}  // namespace loom::data
