// Chat template, label mask and batch collation for vision-language examples.
#include "loom/data/example.h"

#include <algorithm>

#include "loom/util/errors.h"

namespace loom::data {

const std::vector<std::string>& chat_template_words() {
  static const std::vector<std::string> words = {"user", "assistant"};
  return words;
}

TokenizedExample build_vqa_example(const WordTokenizer& tokenizer, const VqaSample& sample,
                                   const ImageProcessor& processor, bool with_answer) {
  TokenizedExample ex;
  ex.images.push_back(processor.process(sample.image));
  ex.question = sample.question;
  ex.answer = sample.answer;
  ex.question_type = sample.question_type;
  const int64_t image_tokens = ex.images[0].tokens;
  const ImageBlock& block = processor.block();

  std::vector<int64_t>& ids = ex.input_ids;
  const int64_t im_start = tokenizer.id("<|im_start|>"), im_end = tokenizer.id("<|im_end|>");
  ids.push_back(im_start);
  ids.push_back(tokenizer.id("user"));
  ids.push_back(tokenizer.id(block.start));
  ids.insert(ids.end(), image_tokens, tokenizer.id(block.pad));
  ids.push_back(tokenizer.id(block.end));
  const std::vector<int64_t> question = tokenizer.encode(sample.question);
  ids.insert(ids.end(), question.begin(), question.end());
  ids.push_back(im_end);
  ids.push_back(im_start);
  ids.push_back(tokenizer.id("assistant"));
  ex.prompt_length = static_cast<int64_t>(ids.size());
  ex.labels.assign(ids.size(), kIgnoreIndex);
  if (with_answer) {
    std::vector<int64_t> answer = tokenizer.encode(sample.answer);
    answer.push_back(im_end);
    ids.insert(ids.end(), answer.begin(), answer.end());
    ex.labels.insert(ex.labels.end(), answer.begin(), answer.end());
  }
  return ex;
}

namespace {

void check_aligned(const TokenizedExample& ex) {
  if (ex.input_ids.size() != ex.labels.size())
    throw DataError(fmt::format("collate: example with {} input ids has {} labels", ex.input_ids.size(),
                                ex.labels.size()));
  if (ex.input_ids.empty()) throw DataError("collate: an example has no tokens");
}

// Collects the examples' image (or video) patches and grids, in order: (rows, ...) and (items, 3).
void add_vision(const std::vector<TokenizedExample>& examples, bool videos, at::Tensor& pixel_values,
                at::Tensor& grid_thw, std::vector<double>* second_per_grid_ts) {
  std::vector<at::Tensor> pixels;
  std::vector<int64_t> grids;
  for (size_t b = 0; b < examples.size(); ++b) {
    for (const VisionInput& vision : videos ? examples[b].videos : examples[b].images) {
      const auto& g = vision.grid_thw;
      if (!vision.pixel_values.defined() || vision.pixel_values.dim() < 2 || vision.pixel_values.size(0) < 1)
        throw DataError(fmt::format("collate: example {} has an {} without pixel rows (grid ({}, {}, {}))", b,
                                    videos ? "video" : "image", g[0], g[1], g[2]));
      pixels.push_back(vision.pixel_values);
      grids.insert(grids.end(), g.begin(), g.end());
      if (second_per_grid_ts) second_per_grid_ts->push_back(vision.second_per_grid);
    }
  }
  pixel_values = pixels.empty() ? at::empty({0, 0}, at::kFloat) : at::cat(pixels, 0).to(at::kFloat);
  grid_thw = at::tensor(grids, at::kLong).reshape({static_cast<int64_t>(grids.size() / 3), 3});
}

// The examples' images and videos, each in order, into the batch.
void add_images(const std::vector<TokenizedExample>& examples, Batch& out) {
  add_vision(examples, /*videos=*/false, out.pixel_values, out.image_grid_thw, nullptr);
  add_vision(examples, /*videos=*/true, out.pixel_values_videos, out.video_grid_thw, &out.second_per_grid_ts);
  for (const TokenizedExample& ex : examples) {
    out.questions.push_back(ex.question);
    out.answers.push_back(ex.answer);
    out.question_types.push_back(ex.question_type);
  }
}

// Labels that are a next-token target: the first token of a sequence never is.
int64_t target_count(const std::vector<int64_t>& labels) {
  return std::count_if(labels.begin() + (labels.empty() ? 0 : 1), labels.end(),
                       [](int64_t label) { return label != kIgnoreIndex; });
}

}  // namespace

std::vector<int64_t> Batch::sequence_lengths() const {
  std::vector<int64_t> lengths;
  if (packed()) {
    for (size_t i = 0; i + 1 < cu_seqlens.size(); ++i) lengths.push_back(cu_seqlens[i + 1] - cu_seqlens[i]);
    return lengths;
  }
  auto sums = attention_mask.sum(1).contiguous();
  return std::vector<int64_t>(sums.data_ptr<int64_t>(), sums.data_ptr<int64_t>() + sums.numel());
}

Batch collate(const std::vector<TokenizedExample>& examples, int64_t pad_id) {
  if (examples.empty()) throw DataError("collate needs at least one example, got none");
  const int64_t batch = static_cast<int64_t>(examples.size());
  int64_t length = 0;
  for (const TokenizedExample& ex : examples) {
    check_aligned(ex);
    length = std::max<int64_t>(length, ex.input_ids.size());
  }
  Batch out;
  out.input_ids = at::full({batch, length}, pad_id, at::kLong);
  out.labels = at::full({batch, length}, kIgnoreIndex, at::kLong);
  out.attention_mask = at::zeros({batch, length}, at::kLong);
  auto ids = out.input_ids.accessor<int64_t, 2>();
  auto labels = out.labels.accessor<int64_t, 2>();
  auto mask = out.attention_mask.accessor<int64_t, 2>();
  for (int64_t b = 0; b < batch; ++b) {
    const TokenizedExample& ex = examples[b];
    for (size_t t = 0; t < ex.input_ids.size(); ++t) {
      ids[b][t] = ex.input_ids[t];
      labels[b][t] = ex.labels[t];
      mask[b][t] = 1;
    }
    out.num_target_tokens += target_count(ex.labels);
  }
  add_images(examples, out);
  return out;
}

Batch pack(const std::vector<TokenizedExample>& examples) {
  if (examples.empty()) throw DataError("pack needs at least one example, got none");
  std::vector<int64_t> ids, labels;
  Batch out;
  out.cu_seqlens.push_back(0);
  for (const TokenizedExample& ex : examples) {
    check_aligned(ex);
    ids.insert(ids.end(), ex.input_ids.begin(), ex.input_ids.end());
    labels.push_back(kIgnoreIndex);
    labels.insert(labels.end(), ex.labels.begin() + 1, ex.labels.end());
    out.num_target_tokens += target_count(ex.labels);
    out.cu_seqlens.push_back(static_cast<int64_t>(ids.size()));
  }
  const int64_t total = static_cast<int64_t>(ids.size());
  out.input_ids = at::tensor(ids, at::kLong).view({1, total});
  out.labels = at::tensor(labels, at::kLong).view({1, total});
  out.attention_mask = at::ones({1, total}, at::kLong);
  add_images(examples, out);
  return out;
}

}  // namespace loom::data
