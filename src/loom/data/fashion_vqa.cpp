// Fashion-MNIST loading and its VQA samples.
#include "loom/data/fashion_vqa.h"

#include <filesystem>

#include "loom/data/idx.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::data {
namespace {

const std::vector<std::string> kQuestions = {
    "what is shown in the image ?",         "what is this ?",
    "what kind of clothing item is this ?", "which item is pictured ?",
    "name the object in the picture .",
};

// <dir>/<name>.gz, or <dir>/<name> when only the unzipped file is there.
std::string find_file(const std::string& dir, const std::string& name) {
  const std::filesystem::path gz = std::filesystem::path(dir) / (name + ".gz");
  const std::filesystem::path plain = std::filesystem::path(dir) / name;
  std::error_code error;
  if (std::filesystem::exists(gz, error)) return gz.string();
  if (std::filesystem::exists(plain, error)) return plain.string();
  throw DataError(
      fmt::format("fashion-mnist file {} not found (nor {}); install the dataset-fashion-mnist "
                  "package or point the data directory at a copy",
                  gz.string(), plain.string()));
}

}  // namespace

FashionMnist::FashionMnist(const std::string& dir, const std::string& split) : split_(split) {
  if (split != "train" && split != "t10k") {
    throw DataError(fmt::format("fashion-mnist split must be train or t10k, got '{}'", split));
  }
  const std::string images_path = find_file(dir, split + "-images-idx3-ubyte");
  const std::string labels_path = find_file(dir, split + "-labels-idx1-ubyte");
  IdxArray images = read_idx(images_path);
  IdxArray labels = read_idx(labels_path);
  if (images.dims.size() != 3 || images.dims[1] != kSide || images.dims[2] != kSide) {
    throw DataError(fmt::format("fashion-mnist images {} have shape [{}]; expected [N, 28, 28]", images_path,
                                fmt::join(images.dims, ", ")));
  }
  if (labels.dims.size() != 1) {
    throw DataError(fmt::format("fashion-mnist labels {} have shape [{}]; expected [N]", labels_path,
                                fmt::join(labels.dims, ", ")));
  }
  if (labels.dims[0] != images.dims[0]) {
    throw DataError(fmt::format("fashion-mnist labels {} hold {} labels but images {} hold {} images",
                                labels_path, labels.dims[0], images_path, images.dims[0]));
  }
  for (size_t i = 0; i < labels.data.size(); ++i) {
    if (labels.data[i] >= kClasses) {
      throw DataError(fmt::format("fashion-mnist labels {}: label {} is {}; expected 0..9", labels_path, i,
                                  labels.data[i]));
    }
  }
  images_ = std::move(images.data);
  labels_ = std::move(labels.data);
}

int FashionMnist::label(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw DataError(fmt::format("fashion-mnist {} index {} out of range [0, {})", split_, index, size()));
  }
  return labels_[static_cast<size_t>(index)];
}

const uint8_t* FashionMnist::pixels(int64_t index) const {
  if (index < 0 || index >= size()) {
    throw DataError(fmt::format("fashion-mnist {} index {} out of range [0, {})", split_, index, size()));
  }
  return images_.data() + static_cast<size_t>(index) * kSide * kSide;
}

FashionVqa::FashionVqa(std::string dir, uint64_t seed)
    : train_(std::make_shared<const FashionMnist>(dir, "train")),
      eval_(std::make_shared<const FashionMnist>(dir, "t10k")),
      seed_(seed) {}

int64_t FashionVqa::size(Split split) const { return (split == Split::train ? train_ : eval_)->size(); }

VqaSample FashionVqa::sample(Split split, int64_t index) const {
  const FashionMnist& data = split == Split::train ? *train_ : *eval_;
  const uint8_t* grey = data.pixels(index);  // checks the index
  Image image{FashionMnist::kSide, FashionMnist::kSide,
              std::vector<uint8_t>(static_cast<size_t>(FashionMnist::kSide) * FashionMnist::kSide * 3)};
  for (int i = 0; i < FashionMnist::kSide * FashionMnist::kSide; ++i) {
    image.rgb[3 * i] = image.rgb[3 * i + 1] = image.rgb[3 * i + 2] = grey[i];
  }
  // Nearby (seed, split, index) triples give unrelated phrasings.
  const uint64_t pick = counter_start(seed_, split == Split::train ? 0 : 1, static_cast<uint64_t>(index));
  return VqaSample{std::move(image), kQuestions[pick % kQuestions.size()], class_names()[data.label(index)],
                   "class"};
}

const std::vector<std::string>& FashionVqa::class_names() {
  static const std::vector<std::string> names = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                                 "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
  return names;
}

const std::vector<std::string>& FashionVqa::questions() { return kQuestions; }

std::vector<std::string> FashionVqa::vocabulary() { return vocabulary_of({&kQuestions, &class_names()}); }

}  // namespace loom::data
