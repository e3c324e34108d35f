// to_yaml writes every key so that parse_config reads back an equal config.
#include <gtest/gtest.h>

#include "loom/config/config.h"

namespace loom::config {
namespace {

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/config/job.yaml";

JobConfig round_trip(const JobConfig& c) { return parse_config(to_yaml(c), c.source); }

TEST(ToYaml, FullExampleRoundTrips) {
  const JobConfig c = load_config(kFixture);
  const JobConfig back = round_trip(c);
  EXPECT_TRUE(back == c) << to_yaml(c);
  // JSON types survive, not only values (json == compares 1 and 1.0 equal).
  EXPECT_TRUE(back.model.hf_config["hidden_size"].is_number_integer());
  EXPECT_TRUE(back.model.hf_config["rope_theta"].is_number_float());
  EXPECT_TRUE(back.model.hf_config["eos_token_id"].is_string());
  EXPECT_TRUE(back.model.hf_config["sliding_window"].is_null());
  EXPECT_EQ(back.model.hf_config.dump(), c.model.hf_config.dump());
  EXPECT_EQ(to_yaml(back), to_yaml(c));
}

// data.system_prompt: absent stays absent (the processor's default), "" stays none, text stays text.
TEST(ToYaml, TheSystemPromptRoundTripsAbsentEmptyOrGiven) {
  const std::string job =
      "model: {family: qwen2_vl, hf_config: a.json}\n"
      "data: {dataset: messages, tokenizer: t.json, datasets: [{path: a.jsonl}]";
  const JobConfig absent = parse_config(job + "}\ntraining: {steps: 1}\n", "job.yaml");
  EXPECT_FALSE(absent.data.system_prompt.has_value());
  EXPECT_EQ(to_yaml(absent).find("system_prompt"), std::string::npos);
  EXPECT_TRUE(round_trip(absent) == absent);
  for (const std::string text : {"", "Be brief.", "Say 'hi': {ok}"}) {
    const JobConfig given = parse_config(
        job + ", system_prompt: " + nlohmann::json(text).dump() + "}\ntraining: {steps: 1}\n", "job.yaml");
    ASSERT_TRUE(given.data.system_prompt.has_value());
    EXPECT_EQ(*given.data.system_prompt, text);
    EXPECT_TRUE(round_trip(given) == given) << to_yaml(given);
    EXPECT_FALSE(given == absent);
  }
}

TEST(ToYaml, DefaultsRoundTripAndDpAutoStaysAuto) {
  JobConfig c;
  c.source = "job.yaml";
  c.model.family = "qwen2_vl";
  c.model.hf_config_path = "configs/models/tiny.json";
  c.training.steps = 5;
  const std::string text = to_yaml(c);
  EXPECT_NE(text.find("  dp: auto\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  lr: 0.001\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  clip_grad: 1.0\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  init_from: \"\"\n"), std::string::npos) << text;
  EXPECT_NE(text.find("  freeze: []\n"), std::string::npos) << text;
  EXPECT_TRUE(round_trip(c) == c) << text;
}

TEST(ToYaml, AwkwardStringsAndNumbersRoundTrip) {
  JobConfig c;
  c.source = "job.yaml";
  c.model.family = "qwen2_5_vl";
  c.model.hf_config = nlohmann::json::parse(R"({
    "true": "true", "n": "null", "digits": "123", "colon": "a: b", "quote": "say \"hi\"\n",
    "big": 18446744073709551615, "neg": -3, "tiny": 1e-300, "whole": 2.0, "third": 0.3333333333333333,
    "list": [1, 2.5, "x", null, false, {"k": [{}]}], "empty_list": [], "empty_object": {},
    "nested": {"deeper": {"deepest": 1}}
  })");
  c.model.init_from = "-dir with spaces/#1";
  c.model.freeze = {"visual", "true", "1", "a,b"};
  c.parallel.dp = 2;
  c.training.steps = 1;
  c.training.lr = 1.0 / 3.0;
  c.training.min_lr = 1e-12;
  c.training.adam_eps = 1e-8;
  c.training.peak_tflops = 123456789.125;
  c.training.output_dir = "null";
  c.training.resume = "~";
  const JobConfig back = round_trip(c);
  EXPECT_TRUE(back == c) << to_yaml(c);
  EXPECT_EQ(back.model.hf_config.dump(), c.model.hf_config.dump()) << to_yaml(c);
  EXPECT_EQ(back.training.lr, 1.0 / 3.0);
  EXPECT_EQ(back.model.freeze, c.model.freeze);
  EXPECT_EQ(back.training.resume, "~");
}

TEST(ToYaml, WritesEveryDeclaredKey) {
  const JobConfig c = load_config(kFixture);
  const std::string text = "\n" + to_yaml(c);
  for (const auto& [table, keys] : declared_keys()) {
    if (table.find('.') != std::string::npos) continue;  // the entries of a list
    EXPECT_NE(text.find("\n" + table + ":\n"), std::string::npos) << table << "\n" << text;
    if (table == "data") continue;  // which data keys are written depends on the dataset (below)
    for (const auto& key : keys) {
      // Read by the Wan DiT's family and the video tasks only (below).
      const bool video_only =
          (table == "model" && (key == "vae" || key == "text_encoder")) ||
          (table == "training" &&
           (key.rfind("sample_", 0) == 0 || key == "flow_shift" || key == "timestep_sampling" ||
            key.rfind("logit_", 0) == 0 || key == "caption_dropout" || key == "eval_videos" ||
            key == "kl_weight" || key == "reconstruction_loss"));
      EXPECT_EQ(text.find("\n  " + key + ":") != std::string::npos, !video_only) << table << "." << key;
    }
  }
  const std::string flow = to_yaml(
      parse_config("model: {family: wan, hf_config: a.json, vae: runs/vae, text_encoder: {d_model: 8}}\n"
                   "data: {dataset: moving_fashion, video_size: 32, frames: 5}\n"
                   "training: {steps: 1, task: flow_matching, flow_shift: 2.5, sample_solver: unipc}\n",
                   "job.yaml"));
  for (const char* line :
       {"\n  vae: runs/vae\n", "\n  text_encoder:\n    d_model: 8\n", "\n  video_size: 32\n",
        "\n  frames: 5\n", "\n  flow_shift: 2.5\n", "\n  sample_solver: unipc\n", "\n  eval_videos: 4\n"})
    EXPECT_NE(flow.find(line), std::string::npos) << line << flow;
  EXPECT_EQ(flow.find("\n  kl_weight:"), std::string::npos) << flow;
  EXPECT_EQ(flow.find("\n  image_size:"), std::string::npos) << flow;
  // Data keys only for the datasets that read them.
  EXPECT_EQ(text.find("\n  tokenizer:"), std::string::npos) << text;
  EXPECT_EQ(text.find("\n  hflip:"), std::string::npos) << text;
  EXPECT_NE(text.find("\n  image_size: 84\n"), std::string::npos) << text;
  const std::string fashion =
      to_yaml(parse_config("model: {family: qwen2_vl, hf_config: a.json}\n"
                           "data: {dataset: fashion_mnist, hflip: true, shift: 3}\n"
                           "training: {steps: 1}\n",
                           "job.yaml"));
  EXPECT_NE(fashion.find("\n  hflip: true\n  shift: 3\n"), std::string::npos) << fashion;
}

TEST(ToYaml, EqualityNoticesEveryField) {
  const JobConfig c = load_config(kFixture);
  JobConfig d = c;
  d.training.peak_tflops += 1;
  EXPECT_FALSE(d == c);
  d = c;
  d.model.hf_config["hidden_size"] = 65;
  EXPECT_FALSE(d == c);
  d = c;
  d.source = "other.yaml";
  EXPECT_TRUE(d == c);
}

}  // namespace
}  // namespace loom::config
