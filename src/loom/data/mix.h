// A seeded, weighted mix of several datasets as one stream with random access, whatever a sample is:
// the layout maps a stream index to (dataset, sample in it, epoch) from the datasets' sizes alone.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace loom::data {

struct MixPosition {
  size_t dataset = 0;  // which dataset
  int64_t sample = 0;  // index into that dataset's usable samples
  int64_t epoch = 0;   // epoch of the mix
};

// An epoch of the mix is as long as all datasets' usable samples together (N = sum of n_d); dataset d
// fills q_d of its positions, q_d proportional to its weight (N * w_d / sum w, rounded by largest
// remainder, ties to the earlier dataset). The positions of an epoch are a random permutation, keyed
// by (seed, epoch), of the block layout [q_0 x dataset 0, q_1 x dataset 1, ...]: weighted sampling
// without replacement over the epoch's quota. Dataset d's draws, counted across epochs, walk through
// its samples in a fresh random order per pass (keyed by (seed, d, pass)), so a small, heavily
// weighted dataset repeats every sample before any sample a third time, and a lightly weighted one
// continues where the previous epoch left off. Immutable; locate() is safe from several threads.
class MixLayout {
 public:
  // `kind` names the datasets in errors ("conversation"), `names` each one (its file).
  // ConfigError for a weight that is not a positive finite number or a count of weights other than
  // of sizes; DataError for a dataset without any usable sample, or for an empty list.
  MixLayout(std::vector<int64_t> sizes, std::vector<double> weights, const std::vector<std::string>& names,
            uint64_t seed, const std::string& kind);

  int64_t size() const { return epoch_size_; }  // positions in one epoch
  size_t dataset_count() const { return sizes_.size(); }
  int64_t dataset_size(size_t dataset) const;  // usable samples of a dataset
  int64_t quota(size_t dataset) const;         // its positions per epoch

  // Any index >= 0; indices past size() fall in later epochs. DataError for a negative index.
  MixPosition locate(int64_t index) const;

 private:
  std::vector<int64_t> sizes_;
  uint64_t seed_ = 0;
  std::string kind_;
  int64_t epoch_size_ = 0;
  std::vector<int64_t> quotas_, starts_;  // starts_[d] = q_0 + ... + q_{d-1}
};

}  // namespace loom::data
