#include "loom/train/vqa_data.h"

#include "loom/util/errors.h"

namespace loom::train {

namespace {

data::WordTokenizer shapes_tokenizer() {
  auto words = data::chat_template_words();
  for (const auto& w : data::ShapesVqa::vocabulary()) words.push_back(w);
  return data::WordTokenizer::from_words(words);
}

}  // namespace

VqaData::VqaData(const config::DataSection& data, uint64_t seed)
    : dataset_(seed, data.image_size), tokenizer_(shapes_tokenizer()), eval_samples_(data.eval_samples) {
  if (data.dataset != "shapes_vqa")
    throw ConfigError(fmt::format("data.dataset: '{}' is not available (valid: shapes_vqa)", data.dataset));
  // The built-in images are small: keep them at their size (no upscaling to the default minimum).
  image_options_.min_pixels = data.image_size * data.image_size;
  image_options_.max_pixels = data.image_size * data.image_size;
}

const std::vector<std::string>& VqaData::question_types() const { return data::ShapesVqa::question_types(); }

data::Batch VqaData::train_batch(int64_t index, int64_t size) const {
  std::vector<data::TokenizedExample> examples;
  examples.reserve(size);
  for (int64_t i = index * size; i < (index + 1) * size; ++i)
    examples.push_back(data::build_vqa_example(tokenizer_, dataset_.sample(data::Split::train, i),
                                               image_options_, /*with_answer=*/true));
  return data::collate(examples, tokenizer_.id("<|endoftext|>"));
}

data::Batch VqaData::eval_prompts(int64_t begin, int64_t end) const {
  std::vector<data::TokenizedExample> examples;
  for (int64_t i = begin; i < end; ++i)
    examples.push_back(data::build_vqa_example(tokenizer_, dataset_.sample(data::Split::eval, i),
                                               image_options_, /*with_answer=*/false));
  return data::collate(examples, tokenizer_.id("<|endoftext|>"));
}

}  // namespace loom::train
