// Loading job configs: values, defaults, inline hf_config typing, and every kind of error message.
#include "loom/config/config.h"

#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "loom/config/foreign_keys.h"
#include "loom/util/errors.h"

namespace loom::config {
namespace {

using ::testing::HasSubstr;

const std::string kFixture = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/config/job.yaml";

// The smallest valid job: the two required keys and hf_config.
const std::string kMinimal =
    "model:\n"
    "  family: qwen2_vl\n"
    "  hf_config: configs/tiny.json\n"
    "training:\n"
    "  steps: 10\n";

// The ConfigError message `f` throws; fails the test if it throws nothing.
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

std::string parse_error(const std::string& yaml, const std::vector<std::string>& overrides = {}) {
  return error_of([&] { parse_config(yaml, "job.yaml", overrides); });
}

// kMinimal with `lines` added to its training section (the last block).
std::string with_training(const std::string& lines) { return kMinimal + lines; }

TEST(LoadConfig, FullExampleParsesToEveryValue) {
  const JobConfig c = load_config(kFixture);
  EXPECT_EQ(c.source, kFixture);

  EXPECT_EQ(c.model.family, "qwen2_5_vl");
  EXPECT_EQ(c.model.hf_config_path, "");
  EXPECT_EQ(c.model.hf_config["hidden_size"], 64);
  EXPECT_EQ(c.model.init_from, "runs/pretrained/step-100");
  EXPECT_EQ(c.model.freeze, (std::vector<std::string>{"visual", "model.embed_tokens"}));

  EXPECT_EQ(c.data.dataset, "shapes_vqa");
  EXPECT_EQ(c.data.image_size, 84);
  EXPECT_EQ(c.data.eval_samples, 200);
  EXPECT_EQ(c.data.eval_max_new_tokens, 16);
  EXPECT_EQ(c.data.max_seq_len, 512);
  EXPECT_EQ(c.data.overlong, "truncate");
  EXPECT_TRUE(c.data.packing);
  EXPECT_EQ(c.data.num_workers, 0);
  EXPECT_EQ(c.data.prefetch, 1);

  EXPECT_EQ(c.parallel.tp, 2);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_EQ(c.parallel.cp, 1);
  EXPECT_EQ(c.parallel.ep, 1);
  EXPECT_EQ(c.parallel.dp, 4);
  EXPECT_TRUE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.zero, 3);
  EXPECT_EQ(c.parallel.timeout_s, 45);
  EXPECT_EQ(c.parallel.bucket_mb, 25);  // zero=3 takes no all-reduce buckets
  EXPECT_EQ(c.parallel.fsdp_plan, (std::vector<std::string>{"visual.blocks.{0-1}", "model.layers.{*}"}));

  EXPECT_EQ(c.features.recompute, "none");

  const TrainingSection& t = c.training;
  EXPECT_EQ(t.steps, 300);
  EXPECT_EQ(t.global_batch_size, 64);
  EXPECT_EQ(t.micro_batch_size, 4);
  EXPECT_EQ(t.lr, 3e-4);
  EXPECT_EQ(t.min_lr, 1e-5);
  EXPECT_EQ(t.warmup_steps, 20);
  EXPECT_EQ(t.weight_decay, 0.1);
  EXPECT_EQ(t.adam_beta1, 0.8);
  EXPECT_EQ(t.adam_beta2, 0.95);
  EXPECT_EQ(t.adam_eps, 1e-6);
  EXPECT_EQ(t.clip_grad, 0.0);
  EXPECT_EQ(t.precision, "bf16");
  EXPECT_EQ(t.seed, 7);
  EXPECT_EQ(t.output_dir, "runs/shapes test");
  EXPECT_EQ(t.save_every, 100);
  EXPECT_EQ(t.keep_last, 3);
  EXPECT_EQ(t.eval_every, 50);
  EXPECT_EQ(t.resume, "none");
  EXPECT_EQ(t.threads, 2);
  EXPECT_EQ(t.peak_tflops, 1.5);
  EXPECT_EQ(t.task, "vlm_sft");

  EXPECT_EQ(c.tools.log_every, 5);
  EXPECT_EQ(c.tools.log_level, "debug");
  EXPECT_FALSE(c.tools.progress_bar);
  EXPECT_TRUE(c.tools.tensorboard);
}

TEST(LoadConfig, InlineHfConfigKeepsYamlTypesInJson) {
  const nlohmann::json hf = load_config(kFixture).model.hf_config;
  ASSERT_TRUE(hf.is_object());
  EXPECT_TRUE(hf["hidden_size"].is_number_integer());
  EXPECT_EQ(hf["hidden_size"].get<int64_t>(), 64);
  EXPECT_TRUE(hf["rms_norm_eps"].is_number_float());
  EXPECT_EQ(hf["rms_norm_eps"].get<double>(), 1e-6);
  EXPECT_TRUE(hf["rope_theta"].is_number_float());
  EXPECT_EQ(hf["rope_theta"].get<double>(), 1000000.0);
  EXPECT_TRUE(hf["tie_word_embeddings"].is_boolean());
  EXPECT_FALSE(hf["tie_word_embeddings"].get<bool>());
  EXPECT_TRUE(hf["use_cache"].get<bool>());
  EXPECT_TRUE(hf["sliding_window"].is_null());
  EXPECT_EQ(hf["model_type"], "qwen2_vl");
  EXPECT_EQ(hf["torch_dtype"], "float32");
  // Quoted digits stay a string.
  EXPECT_TRUE(hf["eos_token_id"].is_string());
  EXPECT_EQ(hf["eos_token_id"], "255");
  EXPECT_EQ(hf["architectures"], nlohmann::json::array({"Qwen2VLForConditionalGeneration"}));
  const nlohmann::json& rope = hf["rope_scaling"];
  ASSERT_TRUE(rope["mrope_section"].is_array());
  EXPECT_EQ(rope["mrope_section"], nlohmann::json::array({2, 3, 3}));
  EXPECT_TRUE(rope["mrope_section"][0].is_number_integer());
  EXPECT_EQ(rope["type"], "default");
  const nlohmann::json& vision = hf["vision_config"];
  EXPECT_EQ(vision["depth"], 2);
  EXPECT_TRUE(vision["scale"].is_number_float());
  EXPECT_EQ(vision["scale"].get<double>(), 0.5);
  EXPECT_TRUE(vision["nested"]["flag"].get<bool>());
  // The whole object, as the same document written in JSON by hand.
  EXPECT_EQ(hf, nlohmann::json::parse(R"({
    "model_type": "qwen2_vl", "hidden_size": 64, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "tie_word_embeddings": false, "use_cache": true, "sliding_window": null, "torch_dtype": "float32",
    "eos_token_id": "255", "architectures": ["Qwen2VLForConditionalGeneration"],
    "rope_scaling": {"mrope_section": [2, 3, 3], "type": "default"},
    "vision_config": {"depth": 2, "embed_dim": 32, "mlp_ratio": 4, "scale": 0.5, "nested": {"flag": true}}
  })"));
}

TEST(LoadConfig, MissingFileNamesThePath) {
  EXPECT_EQ(error_of([] { load_config("no/such/job.yaml"); }),
            "no/such/job.yaml: cannot open the config file");
}

TEST(ParseConfig, DefaultsForEveryOmittedKey) {
  const JobConfig c = parse_config(kMinimal, "job.yaml");
  EXPECT_EQ(c.source, "job.yaml");
  EXPECT_EQ(c.model.family, "qwen2_vl");
  EXPECT_EQ(c.model.hf_config_path, "configs/tiny.json");
  EXPECT_TRUE(c.model.hf_config.is_null());
  EXPECT_EQ(c.model.init_from, "");
  EXPECT_TRUE(c.model.freeze.empty());

  EXPECT_EQ(c.data.dataset, "shapes_vqa");
  EXPECT_EQ(c.data.image_size, 56);
  EXPECT_EQ(c.data.eval_samples, 1000);
  EXPECT_EQ(c.data.max_seq_len, 1024);
  EXPECT_EQ(c.data.overlong, "drop");
  EXPECT_FALSE(c.data.packing);
  EXPECT_EQ(c.data.num_workers, 2);
  EXPECT_EQ(c.data.prefetch, 4);

  EXPECT_EQ(c.parallel.tp, 1);
  EXPECT_EQ(c.parallel.pp, 1);
  EXPECT_EQ(c.parallel.cp, 1);
  EXPECT_EQ(c.parallel.ep, 1);
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_FALSE(c.parallel.sequence_parallel);
  EXPECT_EQ(c.parallel.zero, 0);
  EXPECT_EQ(c.parallel.timeout_s, 300);
  EXPECT_EQ(c.parallel.heartbeat_timeout_s, 60);
  EXPECT_EQ(c.parallel.bucket_mb, 25);
  EXPECT_TRUE(c.parallel.overlap_grad_reduce);

  EXPECT_EQ(c.features.recompute, "none");

  const TrainingSection& t = c.training;
  EXPECT_EQ(t.steps, 10);
  EXPECT_EQ(t.global_batch_size, 32);
  EXPECT_EQ(t.micro_batch_size, 8);
  EXPECT_EQ(t.lr, 1e-3);
  EXPECT_EQ(t.min_lr, 0.0);
  EXPECT_EQ(t.warmup_steps, 0);
  EXPECT_EQ(t.weight_decay, 0.0);
  EXPECT_EQ(t.adam_beta1, 0.9);
  EXPECT_EQ(t.adam_beta2, 0.999);
  EXPECT_EQ(t.adam_eps, 1e-8);
  EXPECT_EQ(t.clip_grad, 1.0);
  EXPECT_EQ(t.precision, "fp32");
  EXPECT_EQ(t.seed, 1234);
  EXPECT_EQ(t.output_dir, "runs/default");
  EXPECT_EQ(t.save_every, 0);
  EXPECT_EQ(t.keep_last, 2);
  EXPECT_EQ(t.eval_every, 0);
  EXPECT_EQ(t.resume, "auto");
  EXPECT_EQ(t.threads, 0);
  EXPECT_EQ(t.peak_tflops, 0.0);
  EXPECT_EQ(t.skip_nonfinite_steps, 0);
  EXPECT_EQ(t.task, "vlm_sft");  // so every config written before the key stays valid

  EXPECT_EQ(c.tools.log_every, 10);
  EXPECT_EQ(c.tools.log_level, "info");
  EXPECT_TRUE(c.tools.progress_bar);
  EXPECT_FALSE(c.tools.tensorboard);
}

TEST(ParseConfig, EmptySectionsAndDpAuto) {
  const JobConfig c = parse_config(kMinimal + "data:\nparallel: {dp: auto}\nfeatures: {}\n", "job.yaml");
  EXPECT_EQ(c.data.image_size, 56);
  EXPECT_EQ(c.parallel.dp, 0);
  EXPECT_EQ(parse_config(kMinimal + "parallel: {dp: 3}\n", "job.yaml").parallel.dp, 3);
}

TEST(ParseConfig, DoublesAcceptIntegers) {
  const JobConfig c = parse_config(kMinimal + "  lr: 1\n  clip_grad: 2\n", "job.yaml");
  EXPECT_EQ(c.training.lr, 1.0);
  EXPECT_EQ(c.training.clip_grad, 2.0);
}

TEST(ParseConfigErrors, UnknownKeyListsTheValidOnes) {
  const std::string message = parse_error(with_training("  lrr: 0.1\n"));
  EXPECT_THAT(message, HasSubstr("job.yaml: unknown key 'training.lrr' (valid keys in training: steps, "
                                 "epochs, global_batch_size, micro_batch_size, lr, min_lr,"));
  EXPECT_THAT(message, HasSubstr("peak_tflops, exit_interval, skip_nonfinite_steps, moe_capacity_factor, "
                                 "moe_z_loss, moe_expert_bias_rate; did you mean 'lr'?)"));
  EXPECT_EQ(parse_error(kMinimal + "tools: {color: true}\n"),
            "job.yaml: unknown key 'tools.color' (valid keys in tools: log_every, log_level, progress_bar, "
            "dump_gradients, tensorboard)");
}

TEST(ParseConfigErrors, UnknownSection) {
  EXPECT_EQ(
      parse_error(kMinimal + "optim: {lr: 1}\n"),
      "job.yaml: unknown section 'optim' (valid sections: model, data, parallel, features, training, tools)");
  EXPECT_THAT(parse_error(kMinimal + "tool: {}\n"), HasSubstr("did you mean 'tools'?"));
}

TEST(ParseConfigErrors, WrongTypes) {
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: ten}\n"),
            "job.yaml: training.steps: expected an integer, got 'ten'");
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: 1e3}\n"),
            "job.yaml: training.steps: expected an integer, got '1e3'");
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: 2.0}\n"),
            "job.yaml: training.steps: expected an integer, got '2.0'");
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: \"10\"}\n"),
            "job.yaml: training.steps: expected an integer, got '10' (quoted, so a string)");
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: [1]}\n"),
            "job.yaml: training.steps: expected an integer, got a sequence");
  EXPECT_EQ(
      parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: 99999999999999999999}\n"),
      "job.yaml: training.steps: expected an integer, got '99999999999999999999' (out of range)");
  EXPECT_EQ(parse_error(with_training("  lr: fast\n")),
            "job.yaml: training.lr: expected a number, got 'fast'");
  EXPECT_EQ(parse_error(with_training("  lr: .inf\n")),
            "job.yaml: training.lr: expected a number, got '.inf'");
  EXPECT_EQ(parse_error(with_training("  lr: 1e999\n")),
            "job.yaml: training.lr: expected a number, got '1e999' (out of range)");
  EXPECT_EQ(parse_error(kMinimal + "tools: {progress_bar: yes}\n"),
            "job.yaml: tools.progress_bar: expected true or false, got 'yes'");
  EXPECT_EQ(parse_error(kMinimal + "tools: {progress_bar: 1}\n"),
            "job.yaml: tools.progress_bar: expected true or false, got '1'");
  EXPECT_EQ(parse_error(with_training("  output_dir: {a: 1}\n")),
            "job.yaml: training.output_dir: expected a string, got a mapping");
  EXPECT_EQ(parse_error(with_training("  resume:\n")),
            "job.yaml: training.resume: expected a string, got null");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {dp: two}\n"),
            "job.yaml: parallel.dp: expected an integer >= 1 or auto, got 'two'");
  EXPECT_EQ(
      parse_error(kMinimal + "training_extra: 1\n").rfind("job.yaml: unknown section 'training_extra'", 0),
      0u);
}

// training.device: cpu by default; cuda only in a build against a CUDA libtorch (one line naming
// the key otherwise); TF32 only where CUDA computes.
TEST(ParseConfig, Device) {
  const JobConfig job = parse_config(kMinimal, "job.yaml");
  EXPECT_EQ(job.training.device, "cpu");
  EXPECT_FALSE(job.training.allow_tf32);
  EXPECT_EQ(parse_error(with_training("  device: tpu\n")),
            "job.yaml: training.device: 'tpu' is not one of cpu, cuda");
  EXPECT_EQ(parse_error(with_training("  allow_tf32: true\n")),
            "job.yaml: training.allow_tf32: applies to CUDA's matrix products; training.device is cpu "
            "(remove it)");
#ifdef LOOM_TORCH_CUDA
  const JobConfig cuda = parse_config(with_training("  device: cuda\n  allow_tf32: true\n"), "job.yaml");
  EXPECT_EQ(cuda.training.device, "cuda");
  EXPECT_TRUE(cuda.training.allow_tf32);
#else
  EXPECT_EQ(parse_error(with_training("  device: cuda\n")),
            "job.yaml: training.device: cuda needs Loom built against a CUDA libtorch; this build's libtorch "
            "is CPU-only (README: \"Training on GPUs\")");
#endif
}

TEST(ParseConfigErrors, EnumsNameTheValidValues) {
  EXPECT_EQ(parse_error(with_training("  precision: fp16\n")),
            "job.yaml: training.precision: 'fp16' is not one of fp32, bf16");
  EXPECT_EQ(
      parse_error(kMinimal + "data: {dataset: mnist}\n"),
      "job.yaml: data.dataset: 'mnist' is not one of shapes_vqa, fashion_mnist, moving_fashion, messages, "
      "videos");
  EXPECT_EQ(parse_error(kMinimal + "data: {dir: /data/x}\n"),
            "job.yaml: data.dir: is not used by dataset shapes_vqa (it is generated, not read); remove it");
  EXPECT_EQ(parse_error(kMinimal + "features: {recompute: block}\n"),
            "job.yaml: features.recompute: 'block' is not one of none, full, selective");
  EXPECT_EQ(
      parse_error(kMinimal + "features: {recompute_layers: 2}\n"),
      "job.yaml: features.recompute_layers: is used only with features.recompute full or selective; it is "
      "none");
  EXPECT_EQ(parse_error(kMinimal + "features: {recompute: full, recompute_layers: -1}\n"),
            "job.yaml: features.recompute_layers: must be >= 0, got -1");
  EXPECT_EQ(parse_config(kMinimal + "features: {recompute: full, recompute_layers: 3}\n", "job.yaml")
                .features.recompute_layers,
            3);
  EXPECT_EQ(
      parse_error(kMinimal + "features: {offload: true}\n"),
      "job.yaml: features.offload: moves out the inputs that full recompute keeps; features.recompute is "
      "none (set it to full)");
  EXPECT_EQ(
      parse_error(kMinimal + "features: {offload: true, recompute: selective}\n"),
      "job.yaml: features.offload: moves out the inputs that full recompute keeps; features.recompute is "
      "selective (set it to full)");
  EXPECT_TRUE(
      parse_config(kMinimal + "features: {offload: true, recompute: full}\n", "job.yaml").features.offload);
  EXPECT_EQ(parse_error(with_training("  task: dpo\n")),
            "job.yaml: training.task: 'dpo' is not one of vlm_sft, flow_matching, vae");
  EXPECT_EQ(parse_error(kMinimal, {"training.task=sft"}),
            "--set training.task=sft: 'sft' is not one of vlm_sft, flow_matching, vae");
  EXPECT_EQ(parse_config(with_training("  task: vlm_sft\n"), "job.yaml").training.task, "vlm_sft");
  EXPECT_EQ(parse_error(kMinimal + "tools: {log_level: verbose}\n"),
            "job.yaml: tools.log_level: 'verbose' is not one of trace, debug, info, warn, error");
  EXPECT_EQ(
      parse_error(kMinimal + "data: {hflip: true}\n"),
      "job.yaml: data.hflip: shapes_vqa asks which side a shape is on: a mirrored image would contradict "
      "its answers");
  EXPECT_EQ(parse_error(kMinimal + "data: {shift: 2}\n"),
            "job.yaml: data.shift: shapes_vqa asks which quadrant a shape is in: a moved image could carry "
            "a shape across the boundary and contradict its answers");
  EXPECT_EQ(parse_error(kMinimal + "data: {dataset: fashion_mnist, image_size: 28, shift: 14}\n"),
            "job.yaml: data.shift: must be less than half of data.image_size (28), got 14");
  EXPECT_EQ(parse_error(kMinimal + "data: {dataset: fashion_mnist, shift: -1}\n"),
            "job.yaml: data.shift: must be >= 0, got -1");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {zero: 2}\n"),
            "job.yaml: parallel.zero: 2 is not one of 0, 1, 3");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {fsdp_plan: ['model.layers.{*}']}\n"),
            "job.yaml: parallel.fsdp_plan: is used only with parallel.zero=3 (FSDP); zero is 0");
  const JobConfig buckets =
      parse_config(kMinimal + "parallel: {bucket_mb: 4, overlap_grad_reduce: false}\n", "job.yaml", {});
  EXPECT_EQ(buckets.parallel.bucket_mb, 4);
  EXPECT_FALSE(buckets.parallel.overlap_grad_reduce);
  EXPECT_EQ(parse_error(kMinimal + "parallel: {zero: 1, bucket_mb: 4}\n"),
            "job.yaml: parallel.bucket_mb: sizes the all-reduce buckets of zero=0; zero=1 reduce-scatters "
            "without them (remove it)");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {zero: 3, overlap_grad_reduce: false}\n"),
            "job.yaml: parallel.overlap_grad_reduce: applies to the all-reduce buckets of zero=0; zero=3 has "
            "none (remove it)");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {zero: 3, fsdp_plan: ['']}\n"),
            "job.yaml: parallel.fsdp_plan: entry 0 is an empty module path");
}

TEST(ParseConfigErrors, Ranges) {
  EXPECT_EQ(parse_error(with_training("  keep_last: 0\n")),
            "job.yaml: training.keep_last: must be >= 1, got 0");
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: 0}\n"),
            "job.yaml: training.steps: must be >= 1, got 0");
  EXPECT_EQ(parse_error(with_training("  lr: 0\n")), "job.yaml: training.lr: must be > 0, got 0");
  EXPECT_EQ(parse_error(with_training("  min_lr: 0.01\n")),
            "job.yaml: training.min_lr: must be <= training.lr (0.001), got 0.01");
  EXPECT_EQ(parse_error(with_training("  adam_beta2: 1.0\n")),
            "job.yaml: training.adam_beta2: must be in [0, 1), got 1");
  EXPECT_EQ(parse_error(with_training("  adam_eps: 0.0\n")),
            "job.yaml: training.adam_eps: must be > 0, got 0");
  EXPECT_EQ(parse_error(with_training("  clip_grad: -1\n")),
            "job.yaml: training.clip_grad: must be >= 0, got -1");
  EXPECT_EQ(parse_error(with_training("  save_every: -5\n")),
            "job.yaml: training.save_every: must be >= 0, got -5");
  EXPECT_EQ(parse_error(with_training("  output_dir: \"\"\n")),
            "job.yaml: training.output_dir: must not be empty (a directory for checkpoints and logs)");
  EXPECT_EQ(parse_error(kMinimal + "data: {image_size: 50}\n"),
            "job.yaml: data.image_size: must be a positive multiple of 28, got 50");
  EXPECT_EQ(parse_error(kMinimal + "data: {image_size: 0}\n"),
            "job.yaml: data.image_size: must be a positive multiple of 28, got 0");
  EXPECT_EQ(parse_error(kMinimal + "data: {prefetch: 0}\n"), "job.yaml: data.prefetch: must be >= 1, got 0");
  EXPECT_EQ(parse_error(kMinimal + "data: {num_workers: -1}\n"),
            "job.yaml: data.num_workers: must be >= 0, got -1");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {tp: 0}\n"), "job.yaml: parallel.tp: must be >= 1, got 0");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {dp: 0}\n"),
            "job.yaml: parallel.dp: must be >= 1 or auto, got 0");
  EXPECT_EQ(parse_error(kMinimal + "tools: {log_every: 0}\n"),
            "job.yaml: tools.log_every: must be >= 1, got 0");
}

// Counts that become threads, queue slots or allocations are bounded before anything narrows or
// allocates them: 1e6 loader workers failed with "Resource temporarily unavailable", a prefetch of
// 1e12 was cut to 32 bits, batch sizes of 2^62 failed in vector::reserve.
TEST(ParseConfigErrors, CountsAreBoundedBeforeUse) {
  EXPECT_EQ(parse_error(kMinimal + "data: {num_workers: 1000000}\n"),
            "job.yaml: data.num_workers: must be <= 256, got 1000000");
  EXPECT_EQ(parse_error(kMinimal + "data: {prefetch: 1000000000000}\n"),
            "job.yaml: data.prefetch: must be <= 4096, got 1000000000000");
  EXPECT_EQ(parse_error(with_training("  threads: 4294967298\n")),
            "job.yaml: training.threads: must be <= 4096, got 4294967298");
  EXPECT_EQ(parse_error(with_training("  global_batch_size: 4611686018427387904\n")),
            "job.yaml: training.global_batch_size: must be <= 1048576, got 4611686018427387904");
  EXPECT_EQ(parse_error(with_training("  micro_batch_size: 4611686018427387904\n")),
            "job.yaml: training.micro_batch_size: must be <= 1048576, got 4611686018427387904");
  EXPECT_EQ(parse_error(kMinimal + "parallel: {heartbeat_timeout_s: 1}\n"),
            "job.yaml: parallel.heartbeat_timeout_s: must be >= 3, got 1");
  EXPECT_EQ(parse_error(with_training("  skip_nonfinite_steps: -1\n")),
            "job.yaml: training.skip_nonfinite_steps: must be >= 0, got -1");
  const JobConfig c = parse_config(kMinimal + "data: {num_workers: 256, prefetch: 4096}\n", "job.yaml");
  EXPECT_EQ(c.data.num_workers, 256);
  EXPECT_EQ(c.data.prefetch, 4096);
}

// Aliases of aliases expand a few hundred bytes of YAML to billions of values (std::bad_alloc, or
// minutes of work): the expansion is bounded, as is the nesting.
TEST(ParseConfigErrors, YamlAliasBombAndDeepNesting) {
  std::string bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n";
  for (char name = 'b'; name <= 'i'; ++name) {
    const char previous = static_cast<char>(name - 1);
    bomb += fmt::format("{}: &{} [*{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}, *{p}]\n", name, name,
                        fmt::arg("p", previous));
  }
  EXPECT_THAT(parse_error(bomb), HasSubstr("job.yaml: expands to more than 100000 values"));
  EXPECT_THAT(parse_error(kMinimal + "tools: " + std::string(100, '[') + std::string(100, ']') + "\n"),
              HasSubstr("nested more than 64 levels deep"));
}

// Keys only some families, datasets and tasks read are refused for the others, never ignored.
TEST(ParseConfigErrors, VideoKeysOnlyWhereRead) {
  EXPECT_EQ(parse_error(kMinimal, {"model.vae=runs/vae"}),
            "--set model.vae=runs/vae: is only used by task flow_matching (the denoiser's frozen helpers), "
            "not vlm_sft; remove it");
  EXPECT_EQ(parse_error(kMinimal, {"training.flow_shift=2"}),
            "--set training.flow_shift=2: is only used by task flow_matching, not vlm_sft; "
            "remove it");
  EXPECT_EQ(parse_error(kMinimal, {"training.kl_weight=0.1"}),
            "--set training.kl_weight=0.1: is only used by task vae, not vlm_sft; remove it");
  EXPECT_EQ(parse_error(kMinimal, {"training.reconstruction_loss=l1"}),
            "--set training.reconstruction_loss=l1: is only used by task vae, not vlm_sft; remove it");
  EXPECT_EQ(parse_error(kMinimal, {"data.frames=5"}),
            "--set data.frames=5: is only used by the video datasets moving_fashion and videos, not "
            "shapes_vqa; remove it");
  EXPECT_EQ(parse_error(kMinimal, {"data.dataset=moving_fashion", "data.fps=8"}),
            "--set data.fps=8: is only used by dataset videos, not moving_fashion; remove it");
  EXPECT_EQ(parse_error(kMinimal, {"data.features=f"}),
            "--set data.features=f: is only used by the video datasets moving_fashion and videos, not "
            "shapes_vqa; remove it");
  EXPECT_EQ(
      parse_error(kMinimal, {"data.dataset=videos"}),
      "job.yaml: missing required key 'data.datasets' (a list of {path: FILE} conversation or video files to "
      "train on)");
  EXPECT_EQ(parse_error(kMinimal, {"data.dataset=videos", "data.datasets=[{path: v.jsonl}]", "data.dir=d"}),
            "--set data.dir=d: is not used by dataset videos (its files are listed in data.datasets); "
            "remove it");
  EXPECT_EQ(parse_error(kMinimal, {"data.dataset=videos", "data.datasets=[{path: v.jsonl}]", "data.fps=0"}),
            "--set data.fps=0: must be > 0, got 0");
  EXPECT_EQ(
      parse_error(kMinimal, {"training.eval_videos=2"}),
      "--set training.eval_videos=2: is only used by task flow_matching or vae, not vlm_sft; remove it");
  EXPECT_EQ(parse_error(kMinimal, {"data.dataset=moving_fashion", "data.image_size=56"}),
            "--set data.image_size=56: is not used by dataset moving_fashion (its clips are sized "
            "by data.video_size); remove it");
  const std::string wan =
      "model: {family: wan, hf_config: a.json}\ntraining: {steps: 1, task: flow_matching}\n";
  EXPECT_EQ(parse_error(wan),
            "job.yaml: missing required key 'model.vae' (a latent codec's model directory or a vae job's run "
            "directory, or an inline config whose weights are drawn from the seed)");
  const JobConfig c = parse_config(wan, "job.yaml", {"model.vae=runs/vae", "model.text_encoder.d_model=8"});
  EXPECT_EQ(c.model.vae, "runs/vae");
  EXPECT_TRUE(c.model.vae_config.is_null());
  const JobConfig inline_vae =
      parse_config(wan, "job.yaml", {"model.vae.z_dim=4", "model.text_encoder.d_model=8"});
  EXPECT_EQ(inline_vae.model.vae, "");
  EXPECT_EQ(inline_vae.model.vae_config["z_dim"], 4);
  EXPECT_EQ(c.model.text_encoder["d_model"], 8);
  EXPECT_EQ(c.training.flow_shift, 3.0);
  EXPECT_EQ(c.training.sample_solver, "dpm++");
}

TEST(LoadConfig, ADirectoryIsNoConfigFile) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/configs";
  EXPECT_EQ(error_of([&] { load_config(dir); }), dir + ": cannot read the config file: it is a directory");
}

TEST(ParseConfig, EpochsInsteadOfSteps) {
  const std::string model = "model: {family: qwen2_vl, hf_config: a.json}\n";
  const JobConfig c = parse_config(model + "training: {epochs: 2.5}\n", "job.yaml");
  EXPECT_EQ(c.training.epochs, 2.5);
  EXPECT_EQ(c.training.steps, 0);  // the task's epoch gives them (tasks/registry.h resolve_steps)
  EXPECT_EQ(parse_error(model + "training: {steps: 100, epochs: 2}\n"),
            "job.yaml: training.epochs: give it or training.steps, not both (training.steps is 100)");
  EXPECT_EQ(parse_error(model + "training: {epochs: -1}\n"),
            "job.yaml: training.epochs: must be >= 0, got -1");
}

// The names users bring from HF Trainer and LLaMA-Factory, in a section or at the top level, get
// Loom's key; a Loom key in the wrong section gets its section.
TEST(ParseConfigErrors, ForeignKeysNameLoomsKey) {
  // Every foreign name points at a key Loom declares.
  for (const ForeignKey& k : foreign_keys()) {
    const std::string key = k.key;
    const size_t dot = key.rfind('.');
    bool declared = false;
    for (const auto& [table, keys] : declared_keys())
      declared |=
          table == key.substr(0, dot) && std::count(keys.begin(), keys.end(), key.substr(dot + 1)) > 0;
    EXPECT_TRUE(declared) << k.name << " -> " << key;
  }
  // The issue's names, inside the section they would go in.
  const std::vector<std::pair<std::string, std::string>> cases = {{"training", "learning_rate"},
                                                                  {"training", "num_train_epochs"},
                                                                  {"training", "per_device_train_batch_size"},
                                                                  {"training", "gradient_accumulation_steps"},
                                                                  {"data", "cutoff_len"},
                                                                  {"training", "bf16"},
                                                                  {"data", "image_max_pixels"},
                                                                  {"model", "freeze_vision_tower"},
                                                                  {"tools", "logging_steps"},
                                                                  {"training", "save_steps"},
                                                                  {"training", "warmup_ratio"},
                                                                  {"tools", "report_to"}};
  for (const auto& [section, name] : cases) {
    const std::string message = parse_error(kMinimal, {section + "." + name + "=1"});
    EXPECT_THAT(message, HasSubstr("unknown key '" + section + "." + name + "'")) << message;
    EXPECT_THAT(message, HasSubstr("; " + foreign_key_hint(name) + ")")) << message;
  }
  EXPECT_THAT(parse_error(with_training("  learning_rate: 1.0e-5\n")),
              HasSubstr("; did you mean training.lr? (HF Trainer's learning_rate: the same value))"));
  EXPECT_THAT(
      parse_error(with_training("  warmup_ratio: 0.1\n")),
      HasSubstr("; did you mean training.warmup_steps? (HF Trainer's warmup_ratio: warmup_ratio x the "
                "step count, as a number of steps))"));
  // At the top level: one name, and a flat file of them in one line.
  EXPECT_THAT(
      parse_error(kMinimal + "cutoff_len: 2048\n"),
      HasSubstr("unknown section 'cutoff_len' (valid sections: model, data, parallel, features, training, "
                "tools; did you mean data.max_seq_len? (LLaMA-Factory's cutoff_len: the same value))"));
  EXPECT_THAT(parse_error("learning_rate: 1.0e-5\nbf16: true\nlora_rank: 8\n"),
              HasSubstr("unknown sections 'learning_rate' (did you mean training.lr? (HF Trainer's "
                        "learning_rate: the same value)), 'bf16' (did you mean training.precision? (HF "
                        "Trainer's bf16: bf16: true is precision: bf16)), 'lora_rank' (valid sections: "));
  // A Loom key in another section.
  EXPECT_THAT(parse_error(with_training("  max_seq_len: 512\n")),
              HasSubstr("; did you mean data.max_seq_len?)"));
  EXPECT_THAT(parse_error(kMinimal + "lr: 0.1\n"), HasSubstr("; did you mean training.lr?)"));
}

TEST(ParseConfigErrors, MissingRequiredKeys) {
  EXPECT_EQ(
      parse_error("model: {family: qwen2_vl, hf_config: a.json}\n"),
      "job.yaml: missing required key 'training.steps' (the number of optimizer steps, an integer > 0; or "
      "training.epochs, the passes over the training data)");
  EXPECT_EQ(
      parse_error("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {lr: 0.1}\n"),
      "job.yaml: missing required key 'training.steps' (the number of optimizer steps, an integer > 0; or "
      "training.epochs, the passes over the training data)");
  EXPECT_EQ(parse_error("training: {steps: 1}\n"),
            "job.yaml: missing required key 'model.family' (a model family, as `loom shapes` lists them)");
  EXPECT_THAT(parse_error("model: {family: qwen2_vl}\ntraining: {steps: 1}\n"),
              HasSubstr("job.yaml: missing required key 'model.hf_config'"));
  EXPECT_THAT(parse_error(""), HasSubstr("job.yaml: missing required key 'model.family'"));
}

TEST(ParseConfigErrors, ModelShapes) {
  EXPECT_EQ(
      parse_error("model: {family: qwen2_vl, hf_config: [a]}\ntraining: {steps: 1}\n"),
      "job.yaml: model.hf_config: expected a path to a HF config.json, a published model's name or an inline "
      "mapping of its fields, got a sequence");
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: {}}\ntraining: {steps: 1}\n"),
            "job.yaml: model.hf_config: the inline mapping is empty");
  EXPECT_THAT(parse_error("model: {family: qwen2_vl, hf_config: ''}\ntraining: {steps: 1}\n"),
              HasSubstr("job.yaml: model.hf_config: must not be empty"));
  EXPECT_EQ(parse_error("model: {family: qwen2_vl, hf_config: {a: .inf}}\ntraining: {steps: 1}\n"),
            "job.yaml: model.hf_config.a: '.inf' cannot be written in JSON");
  EXPECT_EQ(
      parse_error(kMinimal.substr(0, kMinimal.find("training")) + "  freeze: visual\ntraining: {steps: 1}\n"),
      "job.yaml: model.freeze: expected a list of strings such as [a, b], got 'visual'");
  EXPECT_EQ(
      parse_error(kMinimal.substr(0, kMinimal.find("training")) + "  freeze: [[a]]\ntraining: {steps: 1}\n"),
      "job.yaml: model.freeze[0]: expected a string, got a sequence");
}

TEST(ParseConfigErrors, DocumentShape) {
  EXPECT_EQ(
      parse_error(kMinimal + "data: 5\n"),
      "job.yaml: data: expected a mapping of keys (dataset, tokenizer, datasets, eval_datasets, "
      "dataset_info, train_on_prompt, system_prompt, min_pixels, max_pixels, video_fps, video_max_frames, "
      "video_min_pixels, video_max_pixels, dir, image_size, hflip, shift, "
      "video_size, frames, fps, "
      "features, "
      "eval_samples, "
      "eval_max_new_tokens, "
      "max_seq_len, overlong, "
      "packing, num_workers, prefetch), got '5'");
  EXPECT_EQ(
      parse_error("- a\n- b\n"),
      "job.yaml: expected a mapping of sections (model, data, parallel, features, training, tools), got a "
      "sequence");
  EXPECT_EQ(parse_error(kMinimal + "  steps: 20\n"), "job.yaml: duplicate key 'training.steps'");
  EXPECT_EQ(parse_error(kMinimal + "---\ntraining: {steps: 1}\n"),
            "job.yaml: holds 2 YAML documents; a job is one document");
  EXPECT_THAT(parse_error("model: {family: [qwen2_vl\ntraining: {steps: 1}\n"),
              HasSubstr("job.yaml: invalid YAML at line"));
  EXPECT_EQ(
      parse_error(with_training("  steps2: !!int 3\n")),
      "job.yaml: training.steps2: unsupported YAML tag 'tag:yaml.org,2002:int' (write the value without a "
      "tag)");
}

TEST(Overrides, ReplaceAnExistingKey) {
  const JobConfig c = parse_config(kMinimal, "job.yaml", {"training.steps=25"});
  EXPECT_EQ(c.training.steps, 25);
}

TEST(Overrides, CreateKeysTheFileOmitted) {
  const JobConfig c =
      parse_config(kMinimal, "job.yaml", {"training.lr=1e-4", "tools.log_level=debug", "parallel.dp=auto"});
  EXPECT_EQ(c.training.lr, 1e-4);
  EXPECT_EQ(c.tools.log_level, "debug");
  EXPECT_EQ(c.parallel.dp, 0);
  // Even the required ones.
  const JobConfig d =
      parse_config("model: {family: qwen2_vl, hf_config: a.json}\n", "job.yaml", {"training.steps=3"});
  EXPECT_EQ(d.training.steps, 3);
}

TEST(Overrides, ListMapAndEmptyValues) {
  const JobConfig c = parse_config(
      kMinimal, "job.yaml",
      {"model.freeze=[visual, model.layers.0]", "model.init_from=runs/a b", "training.output_dir=\"x: y\""});
  EXPECT_EQ(c.model.freeze, (std::vector<std::string>{"visual", "model.layers.0"}));
  EXPECT_EQ(c.model.init_from, "runs/a b");
  EXPECT_EQ(c.training.output_dir, "x: y");

  const JobConfig inline_hf =
      parse_config(kMinimal, "job.yaml", {"model.hf_config={hidden_size: 32, rope: {theta: 1e4}}"});
  EXPECT_EQ(inline_hf.model.hf_config_path, "");
  EXPECT_EQ(inline_hf.model.hf_config,
            nlohmann::json::parse(R"({"hidden_size": 32, "rope": {"theta": 10000.0}})"));
  EXPECT_TRUE(inline_hf.model.hf_config["rope"]["theta"].is_number_float());

  // A dotted key reaches into an inline hf_config.
  const JobConfig deep = parse_config(
      kMinimal, "job.yaml", {"model.hf_config={hidden_size: 32}", "model.hf_config.vision_config.depth=4"});
  EXPECT_EQ(deep.model.hf_config,
            nlohmann::json::parse(R"({"hidden_size": 32, "vision_config": {"depth": 4}})"));

  const JobConfig cleared =
      parse_config(kMinimal + "  resume: none\n", "job.yaml", {"model.init_from=", "training.steps=1"});
  EXPECT_EQ(cleared.model.init_from, "");
  EXPECT_EQ(cleared.training.resume, "none");
}

TEST(Overrides, LaterWins) {
  EXPECT_EQ(parse_config(kMinimal, "job.yaml", {"training.steps=2", "training.steps=7"}).training.steps, 7);
}

TEST(Overrides, ErrorsNameTheSet) {
  EXPECT_EQ(parse_error(kMinimal, {"training.steps=x"}),
            "--set training.steps=x: expected an integer, got 'x'");
  EXPECT_EQ(parse_error(kMinimal, {"training.keep_last=0"}),
            "--set training.keep_last=0: must be >= 1, got 0");
  EXPECT_EQ(parse_error(kMinimal, {"training.precision=fp16"}),
            "--set training.precision=fp16: 'fp16' is not one of fp32, bf16");
  EXPECT_THAT(parse_error(kMinimal, {"training.lrr=1"}),
              HasSubstr("--set training.lrr=1: unknown key 'training.lrr' (valid keys in training: steps,"));
  EXPECT_THAT(parse_error(kMinimal, {"optim.lr=1"}), HasSubstr("--set optim.lr=1: unknown section 'optim'"));
  // A --set that replaces a whole section names the key inside it.
  EXPECT_EQ(parse_error(kMinimal, {"tools={log_every: often}"}),
            "--set tools={log_every: often}: tools.log_every: expected an integer, got 'often'");
  EXPECT_EQ(parse_error(kMinimal, {"training.steps"}),
            "--set training.steps: expected key=value with a dotted key, e.g. --set training.lr=1e-4");
  EXPECT_EQ(parse_error(kMinimal, {"training..steps=1"}),
            "--set training..steps=1: 'training..steps' is not a dotted key like training.lr");
  EXPECT_EQ(parse_error(kMinimal, {"training.steps.max=1"}),
            "--set training.steps.max=1: 'training.steps' is '10', not a mapping, so it has no key 'max'");
  EXPECT_THAT(parse_error(kMinimal, {"model.freeze=[visual"}),
              HasSubstr("--set model.freeze=[visual: invalid YAML at line 1"));
  // Values the file got wrong still name the file.
  EXPECT_EQ(parse_error(with_training("  lr: fast\n"), {"training.steps=3"}),
            "job.yaml: training.lr: expected a number, got 'fast'");
}

}  // namespace
}  // namespace loom::config

namespace loom::config {
namespace {

TEST(ParseConfig, FashionMnistReadsItsDirectory) {
  const JobConfig c = parse_config(
      kMinimal + "data: {dataset: fashion_mnist, dir: /data/fm, image_size: 28}\n", "job.yaml", {});
  EXPECT_EQ(c.data.dataset, "fashion_mnist");
  EXPECT_EQ(c.data.dir, "/data/fm");
  EXPECT_EQ(c.data.image_size, 28);
  EXPECT_EQ(parse_config(kMinimal, "job.yaml", {}).data.dir, "");
}

}  // namespace
}  // namespace loom::config

namespace loom::config {
namespace {

const std::string kMessages = kMinimal +
                              "data:\n"
                              "  dataset: messages\n"
                              "  tokenizer: tok/tokenizer.json\n"
                              "  datasets:\n"
                              "    - {path: a.jsonl, weight: 3}\n"
                              "    - path: b.jsonl\n"
                              "      root: /images\n"
                              "      fields: {messages: conversations, role: from, user: human}\n"
                              "  eval_datasets: [{path: held_out.json}]\n"
                              "  train_on_prompt: true\n"
                              "  min_pixels: 784\n"
                              "  max_pixels: 50176\n";

TEST(MessagesConfig, ParsesFilesWeightsAndFieldNamesAndRoundTrips) {
  const JobConfig c = parse_config(kMessages, "job.yaml");
  EXPECT_EQ(c.data.dataset, "messages");
  EXPECT_EQ(c.data.tokenizer, "tok/tokenizer.json");
  ASSERT_EQ(c.data.datasets.size(), 2u);
  EXPECT_EQ(c.data.datasets[0].path, "a.jsonl");
  EXPECT_EQ(c.data.datasets[0].root, "");
  EXPECT_EQ(c.data.datasets[0].weight, 3.0);
  EXPECT_TRUE(c.data.datasets[0].fields.empty());
  EXPECT_EQ(c.data.datasets[1].root, "/images");
  EXPECT_EQ(c.data.datasets[1].weight, 1.0);
  EXPECT_EQ(c.data.datasets[1].fields,
            (std::map<std::string, std::string>{
                {"messages", "conversations"}, {"role", "from"}, {"user", "human"}}));
  ASSERT_EQ(c.data.eval_datasets.size(), 1u);
  EXPECT_EQ(c.data.eval_datasets[0].path, "held_out.json");
  EXPECT_TRUE(c.data.train_on_prompt);
  EXPECT_EQ(c.data.min_pixels, 784);
  EXPECT_EQ(c.data.max_pixels, 50176);
  const JobConfig back = parse_config(to_yaml(c), "job.yaml");
  EXPECT_TRUE(back == c) << to_yaml(c);
}

TEST(MessagesConfig, ErrorsNameTheKey) {
  const std::string base = kMinimal + "data:\n  dataset: messages\n";
  EXPECT_EQ(
      parse_error(base + "  datasets: [{path: a.jsonl}]\n"),
      "job.yaml: missing required key 'data.tokenizer' (a HuggingFace tokenizer.json or a SentencePiece "
      ".model)");
  EXPECT_EQ(parse_error(base + "  tokenizer: t.json\n"),
            "job.yaml: missing required key 'data.datasets' (a list of {path: FILE} conversation or video "
            "files to train "
            "on)");
  const std::string with_tok = base + "  tokenizer: t.json\n";
  EXPECT_NE(parse_error(with_tok + "  datasets: [{path: a.jsonl, weight: 0}]\n")
                .find("data.datasets[0].weight: must be > 0"),
            std::string::npos);
  EXPECT_NE(parse_error(with_tok + "  datasets: [{path: a.jsonl, fields: {speaker: from}}]\n")
                .find("unknown key 'data.datasets[0].fields.speaker'"),
            std::string::npos);
  EXPECT_NE(
      parse_error(with_tok + "  datasets: [{root: x}]\n")
          .find("missing required key 'data.datasets[0].path' (the conversation file, a JSON array or JSON "
                "lines; or name, a dataset of data.dataset_info)"),
      std::string::npos);
  // A dataset of a LLaMA-Factory registry, by name: with the registry, instead of a path.
  const JobConfig named = parse_config(
      with_tok + "  dataset_info: lf/dataset_info.json\n  datasets: [{name: mllm_demo, weight: 2}]\n",
      "job.yaml");
  EXPECT_EQ(named.data.dataset_info, "lf/dataset_info.json");
  EXPECT_EQ(named.data.datasets.at(0).name, "mllm_demo");
  EXPECT_TRUE(parse_config(to_yaml(named), "job.yaml") == named) << to_yaml(named);
  EXPECT_EQ(parse_error(with_tok + "  datasets: [{name: mllm_demo}]\n"),
            "job.yaml: missing required key 'data.dataset_info' (the LLaMA-Factory dataset_info.json that "
            "data.datasets[0].name 'mllm_demo' is looked up in)");
  EXPECT_NE(
      parse_error(with_tok + "  dataset_info: i.json\n  datasets: [{name: d, path: a.jsonl}]\n")
          .find("data.datasets[0].name: give it or data.datasets[0].path, not both (data.datasets[0].path is "
                "a.jsonl)"),
      std::string::npos);
  EXPECT_NE(parse_error(with_tok + "  datasets: [{path: a.jsonl, format: jsonl}]\n")
                .find("data.datasets[0].format: 'jsonl' is not one of auto, messages, sharegpt, alpaca"),
            std::string::npos)
      << parse_error(with_tok + "  datasets: [{path: a.jsonl, format: jsonl}]\n");
  EXPECT_EQ(parse_config(with_tok + "  datasets: [{path: a.jsonl, format: sharegpt}]\n", "job.yaml")
                .data.datasets.at(0)
                .format,
            "sharegpt");
  EXPECT_NE(parse_error(with_tok + "  datasets: a.jsonl\n").find("data.datasets: expected a list"),
            std::string::npos);
  EXPECT_NE(parse_error(with_tok + "  datasets: [{path: a.jsonl}]\n  image_size: 56\n")
                .find("data.image_size: is not used by dataset messages"),
            std::string::npos);
  EXPECT_NE(parse_error(kMinimal + "data:\n  dataset: fashion_mnist\n  tokenizer: t.json\n")
                .find("data.tokenizer: is only used by dataset messages, not fashion_mnist; remove it"),
            std::string::npos);
  EXPECT_NE(parse_error(with_tok + "  datasets: [{path: a.jsonl}]\n  min_pixels: 900\n  max_pixels: 800\n")
                .find("data.max_pixels: must be >= min_pixels (900), got 800"),
            std::string::npos);
}

}  // namespace
}  // namespace loom::config
