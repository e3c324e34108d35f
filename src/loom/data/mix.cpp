#include "loom/data/mix.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {
namespace {

uint64_t derive_key(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) {
  return splitmix64(splitmix64(splitmix64(splitmix64(seed) ^ a) ^ b) ^ c);
}

constexpr uint64_t kEpochOrderTag = 0x6d69782d6f726465ULL;    // positions of a mix epoch
constexpr uint64_t kDatasetOrderTag = 0x646174612d6f7264ULL;  // a dataset's samples in one pass

}  // namespace

MixLayout::MixLayout(std::vector<int64_t> sizes, std::vector<double> weights,
                     const std::vector<std::string>& names, uint64_t seed, const std::string& kind)
    : sizes_(std::move(sizes)), seed_(seed), kind_(kind) {
  if (weights.size() != sizes_.size())
    throw ConfigError(fmt::format("{} mix: {} datasets but {} weights; give one weight per dataset", kind,
                                  sizes_.size(), weights.size()));
  for (size_t d = 0; d < sizes_.size(); ++d)
    if (!std::isfinite(weights[d]) || weights[d] <= 0)
      throw ConfigError(
          fmt::format("{} dataset {}: weight {} must be a positive number", kind, names[d], weights[d]));
  if (sizes_.empty()) throw DataError(fmt::format("{} mix: no datasets given; list at least one", kind));
  for (size_t d = 0; d < sizes_.size(); ++d) {
    if (sizes_[d] <= 0) throw DataError(fmt::format("{} dataset {} has no usable samples", kind, names[d]));
    epoch_size_ += sizes_[d];
  }
  // Largest remainder: floor of each exact share, the rest to the largest fractions.
  const double total_weight = std::accumulate(weights.begin(), weights.end(), 0.0);
  std::vector<double> fractions(sizes_.size());
  quotas_.assign(sizes_.size(), 0);
  int64_t assigned = 0;
  for (size_t d = 0; d < sizes_.size(); ++d) {
    const double share = static_cast<double>(epoch_size_) * weights[d] / total_weight;
    quotas_[d] = static_cast<int64_t>(std::floor(share));
    fractions[d] = share - std::floor(share);
    assigned += quotas_[d];
  }
  std::vector<size_t> order(sizes_.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return fractions[a] > fractions[b]; });
  for (size_t i = 0; assigned < epoch_size_; i = (i + 1) % order.size(), ++assigned) ++quotas_[order[i]];
  starts_.assign(sizes_.size(), 0);
  for (size_t d = 1; d < sizes_.size(); ++d) starts_[d] = starts_[d - 1] + quotas_[d - 1];
}

int64_t MixLayout::dataset_size(size_t dataset) const {
  if (dataset >= sizes_.size())
    throw DataError(
        fmt::format("{} mix: dataset {} does not exist; there are {}", kind_, dataset, sizes_.size()));
  return sizes_[dataset];
}

int64_t MixLayout::quota(size_t dataset) const {
  dataset_size(dataset);  // bounds check
  return quotas_[dataset];
}

MixPosition MixLayout::locate(int64_t index) const {
  if (index < 0) throw DataError(fmt::format("{} mix: sample index {} is negative", kind_, index));
  MixPosition at;
  at.epoch = index / epoch_size_;
  const uint64_t slot = permute_index(static_cast<uint64_t>(index % epoch_size_), epoch_size_,
                                      derive_key(seed_, kEpochOrderTag, at.epoch, 0));
  // The last dataset whose block starts at or before the slot (datasets with quota 0 own no slot).
  at.dataset = static_cast<size_t>(
      std::upper_bound(starts_.begin(), starts_.end(), static_cast<int64_t>(slot)) - starts_.begin() - 1);
  const int64_t draw = at.epoch * quotas_[at.dataset] + (static_cast<int64_t>(slot) - starts_[at.dataset]);
  const int64_t n = sizes_[at.dataset];
  const int64_t pass = draw / n;
  at.sample = static_cast<int64_t>(permute_index(static_cast<uint64_t>(draw % n), n,
                                                 derive_key(seed_, kDatasetOrderTag, at.dataset, pass)));
  return at;
}

}  // namespace loom::data
