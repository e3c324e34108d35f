#include "loom/tasks/vlm_sft/vqa_data.h"

#include "loom/data/chat_template.h"
#include "loom/data/fashion_vqa.h"
#include "loom/data/synth/shapes_vqa.h"
#include "loom/util/errors.h"
#include "loom/util/random.h"

namespace loom::tasks {

namespace {

// The set's words after the chat template's, and the image block's tokens among the specials.
data::WordTokenizer tokenizer_for(const std::vector<std::string>& vocabulary, const data::ImageBlock& block) {
  auto words = data::chat_template_words();
  words.insert(words.end(), vocabulary.begin(), vocabulary.end());
  return data::WordTokenizer::from_words(words, {block.start, block.pad, block.end});
}

}  // namespace

VqaData::VqaData(const config::DataSection& data, uint64_t seed,
                 std::unique_ptr<data::ImageProcessor> processor)
    : seed_(seed), processor_(std::move(processor)), eval_samples_(data.eval_samples), section_(data) {
  // Every image is processed whole at image_size x image_size: smaller ones are scaled up to it.
  processor_->set_square_images(data.image_size);
  int64_t eval_size = 0;
  if (data.dataset == "shapes_vqa") {
    const data::ShapesVqa shapes(seed, data.image_size);
    eval_size = data::ShapesVqa::kMaxEvalSamples;
    sample_ = [shapes](data::Split split, int64_t i) { return shapes.sample(split, i); };
    question_types_ = data::ShapesVqa::question_types();
    tokenizer_ = tokenizer_for(data::ShapesVqa::vocabulary(), processor_->block());
  } else if (data.dataset == "fashion_mnist") {
    const data::FashionVqa fashion(data.dir.empty() ? data::FashionMnist::kDefaultDir : data.dir, seed);
    sample_ = [fashion](data::Split split, int64_t i) { return fashion.sample(split, i); };
    train_size_ = fashion.size(data::Split::train);
    eval_size = fashion.size(data::Split::eval);
    question_types_ = {"class"};
    tokenizer_ = tokenizer_for(data::FashionVqa::vocabulary(), processor_->block());
  } else {
    throw ConfigError(
        fmt::format("data.dataset: '{}' is not available (valid: shapes_vqa, fashion_mnist)", data.dataset));
  }
  if (eval_samples_ > eval_size)
    throw ConfigError(fmt::format("data.eval_samples: {} is more than the {} held-out samples of {}{}",
                                  eval_samples_, eval_size, data.dataset,
                                  data.dataset == "shapes_vqa" ? " (the cap on its generated split)" : ""));
}

// The streams of counter_start that key each epoch's order of a finite training split, which
// training samples data.hflip mirrors, and how far data.shift moves each.
constexpr uint64_t kEpochOrderStream = 2, kFlipStream = 3, kShiftStream = 4;

data::VqaSample VqaData::sample(data::Split split, int64_t index) const {
  int64_t at = index;
  if (split == data::Split::train && train_size_ > 0) {
    const uint64_t epoch = static_cast<uint64_t>(index / train_size_);
    at = static_cast<int64_t>(permute_index(static_cast<uint64_t>(index % train_size_),
                                            static_cast<uint64_t>(train_size_),
                                            counter_start(seed_, kEpochOrderStream, epoch)));
  }
  data::VqaSample sample = sample_(split, at);
  // Keyed by the position in the run, not the dataset index: each epoch flips its own half.
  if (split == data::Split::train && section_.hflip &&
      (counter_start(seed_, kFlipStream, static_cast<uint64_t>(index)) & 1) != 0)
    sample.image.flip_horizontal();
  if (split == data::Split::train && section_.shift > 0) {
    // Each offset is uniform in [-shift, shift], from its own 32 bits of the sample's key.
    const uint64_t bits = counter_start(seed_, kShiftStream, static_cast<uint64_t>(index));
    const uint64_t span = static_cast<uint64_t>(2 * section_.shift + 1);
    const int dx = static_cast<int>((bits & 0xffffffffu) % span) - static_cast<int>(section_.shift);
    const int dy = static_cast<int>((bits >> 32) % span) - static_cast<int>(section_.shift);
    sample.image.translate(dx, dy);
  }
  return sample;
}

data::TokenizedExample VqaData::example(data::Split split, int64_t index, bool with_answer) const {
  auto ex = data::build_vqa_example(tokenizer_, sample(split, index), *processor_, with_answer);
  // Held-out samples are never cut or dropped: the evaluation set stays what it says it is.
  if (split == data::Split::eval && static_cast<int64_t>(ex.input_ids.size()) > section_.max_seq_len) {
    throw DataError(fmt::format("held-out sample {} has {} tokens, more than data.max_seq_len {}", index,
                                ex.input_ids.size(), section_.max_seq_len));
  }
  return ex;
}

TrainSamples VqaData::train_examples(int64_t begin, int64_t end) const {
  TrainSamples out;
  out.examples.reserve(std::max<int64_t>(end - begin, 0));
  for (int64_t i = begin; i < end; ++i) {
    data::TokenizedExample ex = example(data::Split::train, i, /*with_answer=*/true);
    if (fit_to_length(ex, section_, tokenizer_, processor_->block(), fmt::format("training sample {}", i),
                      out))
      out.examples.push_back(std::move(ex));
  }
  return out;
}

void VqaData::save_tokenizer(const std::string& dir) const { tokenizer_.save(dir + "/tokenizer.json"); }

std::string VqaData::chat_template() const { return data::vqa_template_jinja(processor_->block()); }

data::Batch VqaData::eval_prompts(int64_t begin, int64_t end) const {
  std::vector<data::TokenizedExample> examples;
  for (int64_t i = begin; i < end; ++i)
    examples.push_back(example(data::Split::eval, i, /*with_answer=*/false));
  return data::collate(examples, padding_id(tokenizer_));
}

data::Batch VqaData::eval_examples(int64_t begin, int64_t end) const {
  std::vector<data::TokenizedExample> examples;
  for (int64_t i = begin; i < end; ++i)
    examples.push_back(example(data::Split::eval, i, /*with_answer=*/true));
  return data::collate(examples, padding_id(tokenizer_));
}

}  // namespace loom::tasks
