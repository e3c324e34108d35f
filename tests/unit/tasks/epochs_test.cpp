// training.epochs: the steps of a job given in passes over its data (tasks/registry.h resolve_steps),
// and the data order docs/config.md states for them: step s takes the stream's positions
// [s G, (s + 1) G), and each epoch of N positions holds every sample once.
#include <gtest/gtest.h>

#include <set>
#include <string>

#include "../checkpoint/temp_dir.h"
#include "loom/config/config.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/tasks/registry.h"
#include "loom/tasks/vlm_sft/messages_data.h"
#include "loom/util/errors.h"

namespace loom::tasks {
namespace {

const std::string kFixtures = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/conversations";

class EpochsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string text;
    for (int i = 0; i < 100; ++i)
      text += R"({"messages": [{"role": "user", "content": "question )" + std::to_string(i) +
              R"("}, {"role": "assistant", "content": "ok"}]})" + "\n";
    checkpoint::testing::write_bytes(file_, text);
  }

  // A tiny Qwen2-VL job on the 100-sample file, with these training settings.
  config::JobConfig job(const std::string& training) const {
    return config::parse_config(
        "model:\n"
        "  family: qwen2_vl\n"
        "  hf_config: {model_type: qwen2_vl, vocab_size: 267, hidden_size: 32, intermediate_size: 64,\n"
        "    num_hidden_layers: 1, num_attention_heads: 2, num_key_value_heads: 1,\n"
        "    rope_scaling: {type: mrope, mrope_section: [2, 3, 3]}, vision_start_token_id: 263,\n"
        "    vision_end_token_id: 264, image_token_id: 265, video_token_id: 266,\n"
        "    vision_config: {depth: 1, embed_dim: 16, num_heads: 2, mlp_ratio: 2, hidden_size: 32}}\n"
        "data:\n"
        "  dataset: messages\n"
        "  tokenizer: " +
            kFixtures +
            "/chatml_bpe_tokenizer.json\n"
            "  datasets: [{path: " +
            file_ +
            "}]\n"
            "  eval_samples: 1\n"
            "training: {" +
            training + "}\n",
        "job.yaml");
  }

  // training.steps after resolve_steps.
  int64_t steps_of(const std::string& training) const {
    config::JobConfig j = job(training);
    const BuiltJob built = build_job(j, nullptr);
    resolve_steps(j, *built.task);
    EXPECT_EQ(j.training.epochs, 0);  // a checkpoint's job.yaml records the steps
    return j.training.steps;
  }

  checkpoint::testing::TempDir scratch_;
  std::string file_ = (scratch_.path() / "train.jsonl").string();
};

TEST_F(EpochsTest, StepsAreEveryEpochsSamplesInWholeGlobalBatches) {
  EXPECT_EQ(steps_of("epochs: 2, global_batch_size: 8, micro_batch_size: 8"), 25);     // 200 / 8
  EXPECT_EQ(steps_of("epochs: 2, global_batch_size: 32, micro_batch_size: 8"), 7);     // ceil(200 / 32)
  EXPECT_EQ(steps_of("epochs: 0.5, global_batch_size: 8, micro_batch_size: 8"), 7);    // ceil(50 / 8)
  EXPECT_EQ(steps_of("epochs: 0.3, global_batch_size: 10, micro_batch_size: 10"), 3);  // 30, not 31
  EXPECT_EQ(steps_of("steps: 4, global_batch_size: 8, micro_batch_size: 8"), 4);       // given: kept
}

TEST_F(EpochsTest, EachEpochHoldsEverySampleOnce) {
  const config::JobConfig j = job("epochs: 2, global_batch_size: 8, micro_batch_size: 8");
  const MessagesData data(j.data, static_cast<uint64_t>(j.training.seed),
                          std::make_unique<data::Qwen2VLImageProcessor>(data::Qwen2VLImageOptions{}));
  ASSERT_EQ(data.epoch_samples(), 100);
  for (int64_t epoch = 0; epoch < 3; ++epoch) {
    const TrainSamples samples = data.train_examples(epoch * 100, (epoch + 1) * 100);
    ASSERT_EQ(samples.examples.size(), 100u);
    std::set<std::string> questions;
    for (const auto& example : samples.examples) questions.insert(example.question);
    EXPECT_EQ(questions.size(), 100u) << "epoch " << epoch;
  }
}

TEST_F(EpochsTest, GeneratedDataHasNoEpochs) {
  config::JobConfig j =
      config::parse_config("model: {family: qwen2_vl, hf_config: " + std::string(LOOM_SOURCE_DIR) +
                               "/configs/qwen2vl-tiny-config.json}\n"
                               "data: {dataset: shapes_vqa, eval_samples: 1}\n"
                               "training: {epochs: 1}\n",
                           "job.yaml");
  const BuiltJob built = build_job(j, nullptr);
  try {
    resolve_steps(j, *built.task);
    FAIL() << "shapes_vqa has no epochs";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "training.epochs: dataset shapes_vqa is generated, without epochs; give training.steps");
  }
}

}  // namespace
}  // namespace loom::tasks
