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
  int64_t patches = 0;  // vision patches (rows of pixel_values) of all its images
};

SampleCost cost_of(const TokenizedExample& example);

// Splits n items among `ranks` data-parallel ranks, n / ranks each (DataError unless ranks divides
// n), balancing tokens and patches together. Items are taken by decreasing share of all tokens
// plus share of all patches (ties: lower index first); each goes to the rank with room whose
// larger relative load, tokens or patches, is lowest after taking it (ties: lower rank). Every
// rank's item indices come back in increasing order. Deterministic.
std::vector<std::vector<size_t>> balance_across_ranks(const std::vector<SampleCost>& costs, int64_t ranks);

struct MicroBatching {
  int64_t micro_batch_size = 1;  // samples per micro-batch
  bool packing = false;          // pack() each micro-batch instead of collate()
  int64_t pad_id = 0;            // padding token of collated rows
};

// Cuts one rank's samples of a step into micro-batches of micro_batch_size (DataError unless it
// divides their number): longest first (stable for equal lengths), so each micro-batch holds
// samples of like length and pads little. The loss is normalised over the whole step, so this
// grouping does not change what the step computes.
std::vector<Batch> make_micro_batches(std::vector<TokenizedExample> examples, const MicroBatching& options);

}  // namespace loom::data
