// Packing: a micro-batch packed into one padding-free row (cu_seqlens) gives every sample the
// loss and the parameter gradients it has when run alone, and so does a padded batch.
#include <gtest/gtest.h>

#include "loom/data/batching.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/data/synth/shapes_vqa.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"
#include "loom/tasks/vlm_sft/task.h"
#include "loom/train/trainer.h"

namespace loom::train {
namespace {

std::shared_ptr<models::Qwen2VLForConditionalGeneration> tiny_model(int64_t vocab) {
  const nlohmann::json hf = {{"model_type", "qwen2_vl"},
                             {"vocab_size", vocab},
                             {"hidden_size", 32},
                             {"intermediate_size", 64},
                             {"num_hidden_layers", 2},
                             {"num_attention_heads", 4},
                             {"num_key_value_heads", 2},
                             {"rope_theta", 10000.0},
                             {"tie_word_embeddings", false},
                             {"rope_scaling", {{"type", "mrope"}, {"mrope_section", {1, 1, 2}}}},
                             {"vision_start_token_id", 3},
                             {"vision_end_token_id", 4},
                             {"image_token_id", 5},
                             {"video_token_id", 6},
                             {"vision_config",
                              {{"depth", 2},
                               {"embed_dim", 16},
                               {"num_heads", 2},
                               {"mlp_ratio", 2},
                               {"hidden_size", 32},
                               {"patch_size", 14},
                               {"spatial_merge_size", 2},
                               {"temporal_patch_size", 2}}}};
  auto model = models::build_model(models::model_config_from_json("qwen2_vl", hf, "packing_test"), {});
  models::init_parameters(*model, 5, 0.2);  // large enough that every path matters to the loss
  return model;
}

// Samples of different lengths and image sizes, and one without an image, in one micro-batch.
std::vector<data::TokenizedExample> examples(const data::WordTokenizer& tokenizer) {
  std::vector<data::TokenizedExample> out;
  data::Qwen2VLImageOptions options;
  for (int64_t size : {56, 28, 84}) {
    const data::ShapesVqa shapes(11, size);
    options.min_pixels = options.max_pixels = size * size;
    for (int64_t i : {0, 1})
      out.push_back(data::build_vqa_example(tokenizer, shapes.sample(data::Split::train, i + size),
                                            data::Qwen2VLImageProcessor(options),
                                            /*with_answer=*/true));
  }
  data::TokenizedExample text;
  text.input_ids =
      tokenizer.encode("<|im_start|> user how many shapes are there ? <|im_end|> two <|im_end|>");
  text.labels.assign(text.input_ids.size(), data::kIgnoreIndex);
  text.labels[text.labels.size() - 2] = tokenizer.id("two");
  text.labels.back() = tokenizer.id("<|im_end|>");
  out.push_back(text);
  return out;
}

// Next-token cross-entropy of every position of a (1, L) or (B, L) batch: (B, L - 1).
at::Tensor token_losses(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t length = logits.size(1);
  auto predicted = logits.narrow(1, 0, length - 1);
  auto targets = labels.narrow(1, 1, length - 1);
  return at::cross_entropy_loss(predicted.reshape({-1, logits.size(2)}), targets.reshape({-1}), {},
                                at::Reduction::None, data::kIgnoreIndex)
      .view(targets.sizes());
}

struct Result {
  std::vector<double> losses;               // per sample
  std::map<std::string, at::Tensor> grads;  // of the sum of the losses
};

Result run(models::Qwen2VLForConditionalGeneration& model, const std::vector<data::Batch>& batches) {
  Result r;
  model.zero_grad();
  for (const data::Batch& batch : batches) {
    auto losses = token_losses(model.forward(tasks::model_inputs(batch)), batch.labels);
    if (batch.packed()) {
      for (size_t s = 0; s + 1 < batch.cu_seqlens.size(); ++s) {
        // Predictions made at tokens cu[s] .. cu[s+1]-2 of the row belong to sample s.
        auto part = losses[0].slice(0, batch.cu_seqlens[s], batch.cu_seqlens[s + 1] - 1);
        r.losses.push_back(part.sum().item<double>());
      }
    } else {
      for (int64_t b = 0; b < losses.size(0); ++b) r.losses.push_back(losses[b].sum().item<double>());
    }
    losses.sum().backward();
  }
  for (const auto& [name, p] : models::named_parameters(model)) r.grads[name] = p.grad().clone();
  return r;
}

void expect_same(const Result& got, const Result& want, const std::string& what) {
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i)
    EXPECT_NEAR(got.losses[i], want.losses[i], 1e-5 * std::abs(want.losses[i])) << what << " sample " << i;
  for (const auto& [name, g] : want.grads) {
    const double scale = g.abs().max().item<double>();
    EXPECT_TRUE(at::allclose(got.grads.at(name), g, 1e-4, 1e-5 * scale))
        << what << " " << name << " max diff " << (got.grads.at(name) - g).abs().max().item<double>();
  }
}

TEST(Packing, PackedAndPaddedBatchesMatchSamplesRunOneByOne) {
  at::manual_seed(0);
  auto words = data::chat_template_words();
  for (const auto& w : data::ShapesVqa::vocabulary()) words.push_back(w);
  const auto tokenizer = data::WordTokenizer::from_words(words);
  auto model = tiny_model(tokenizer.vocab_size());
  const auto samples = examples(tokenizer);

  std::vector<data::Batch> alone;
  for (const auto& ex : samples) alone.push_back(data::collate({ex}, 0));
  const Result reference = run(*model, alone);
  for (double loss : reference.losses) ASSERT_GT(loss, 0.1);

  const data::Batch packed = data::pack(samples);
  ASSERT_EQ(packed.input_ids.size(0), 1);
  EXPECT_EQ(packed.cu_seqlens.size(), samples.size() + 1);
  int64_t targets = 0;
  for (const auto& b : alone) targets += b.num_target_tokens;
  EXPECT_EQ(packed.num_target_tokens, targets);
  expect_same(run(*model, {packed}), reference, "packed");
  expect_same(run(*model, {data::collate(samples, 0)}), reference, "padded");
}

}  // namespace
}  // namespace loom::train
