// Fashion VQA: Loom's built-in real dataset, Fashion-MNIST's 28x28 grey clothing photos asked
// "what is shown" with the class name as the answer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "loom/data/vqa.h"

namespace loom::data {

// One split of Fashion-MNIST held in memory: <dir>/<split>-images-idx3-ubyte.gz (N x 28 x 28
// grey bytes) and <dir>/<split>-labels-idx1-ubyte.gz (N labels 0..9, in the order of
// FashionVqa::class_names()), or the same names without .gz when only those are present.
class FashionMnist {
 public:
  static constexpr int kSide = 28;
  static constexpr int kClasses = 10;
  static constexpr const char* kDefaultDir = "/usr/share/datasets/fashion-mnist";

  // split: "train" (60,000 images) or "t10k" (10,000). DataError naming the file when a file is
  // missing, has the wrong shape, a label outside 0..9, or the counts of images and labels differ.
  FashionMnist(const std::string& dir, const std::string& split);

  int64_t size() const { return static_cast<int64_t>(labels_.size()); }
  int label(int64_t index) const;              // 0..9; DataError unless 0 <= index < size()
  const uint8_t* pixels(int64_t index) const;  // (28, 28) grey, row-major; same bounds as label()

 private:
  std::string split_;
  std::vector<uint8_t> images_;  // (N, 28, 28)
  std::vector<uint8_t> labels_;  // (N,)
};

// Fashion-MNIST as visual question answering: train is the 60,000-image training split, eval
// the 10,000-image t10k split. The question's phrasing is chosen from (seed, split, index); the
// image and answer depend on (split, index) alone. Copies share the loaded data, and sample()
// may be called from several threads at once.
class FashionVqa {
 public:
  FashionVqa(std::string dir, uint64_t seed);  // loads both splits from dir (see FashionMnist)

  int64_t size(Split split) const;
  // image: the 28x28 grey photo as RGB (grey in all three channels); question_type "class".
  // DataError unless 0 <= index < size(split).
  VqaSample sample(Split split, int64_t index) const;

  // Answers for labels 0..9: "t-shirt", "trouser", "pullover", "dress", "coat", "sandal", "shirt",
  // "sneaker", "bag", "ankle boot".
  static const std::vector<std::string>& class_names();
  static const std::vector<std::string>& questions();  // every phrasing a question may take
  static std::vector<std::string> vocabulary();        // every word of any question or answer, sorted

 private:
  std::shared_ptr<const FashionMnist> train_, eval_;
  uint64_t seed_;
};

}  // namespace loom::data
