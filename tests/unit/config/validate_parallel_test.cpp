// validate_parallel: the layout must fit the model and the world, and unbuilt parallelism is refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "loom/config/config.h"
#include "loom/util/errors.h"

namespace loom::config {
namespace {

using ::testing::HasSubstr;

// The tiny Qwen2-VL of tests/fixtures/hf-qwen2-vl-tiny: 4 heads, 2 kv heads, 2 vision heads,
// vocabulary 256, 2 layers.
const ModelDims kTiny{4, 2, 2, 256, 2};

JobConfig job(const std::vector<std::string>& overrides) {
  return parse_config("model: {family: qwen2_vl, hf_config: a.json}\ntraining: {steps: 10}\n", "job.yaml",
                      overrides);
}

std::string error_of(const JobConfig& c, const ModelDims& dims, int64_t world) {
  try {
    validate_parallel(c, dims, world);
  } catch (const ConfigError& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected a ConfigError";
  return "";
}

TEST(ValidateParallel, DataParallelLayoutsPass) {
  EXPECT_NO_THROW(validate_parallel(job({}), kTiny, 1));
  EXPECT_NO_THROW(validate_parallel(job({}), kTiny, 4));                   // dp auto = 4, 32 % (8*4) == 0
  EXPECT_NO_THROW(validate_parallel(job({"parallel.zero=3"}), kTiny, 4));  // FSDP
  EXPECT_NO_THROW(validate_parallel(job({"parallel.zero=1"}), kTiny, 2));  // ZeRO-1 runs
  EXPECT_NO_THROW(validate_parallel(job({"parallel.dp=2", "training.micro_batch_size=16"}), kTiny, 2));
  EXPECT_EQ(data_parallel_size(job({}).parallel, 4), 4);
  EXPECT_EQ(data_parallel_size(job({"parallel.dp=2"}).parallel, 8), 2);
  EXPECT_EQ(data_parallel_size(job({"parallel.tp=2", "parallel.pp=2"}).parallel, 12), 3);
}

TEST(ValidateParallel, TpMustDivideHeads) {
  EXPECT_EQ(error_of(job({"parallel.tp=3"}), kTiny, 3),
            "job.yaml: parallel.tp=3 does not divide model heads (llm 4, vision 2); valid tp: 1, 2");
  EXPECT_EQ(error_of(job({"parallel.tp=4"}), kTiny, 4),
            "job.yaml: parallel.tp=4 does not divide model heads (llm 4, vision 2); valid tp: 1, 2");
}

TEST(ValidateParallel, TpAgainstKvHeads) {
  // 6 heads, 3 kv heads: tp 2 neither divides 3 nor is a multiple of it; 6 is a multiple (kv replicated).
  const ModelDims dims{6, 3, 6, 600, 4};
  EXPECT_EQ(
      error_of(job({"parallel.tp=2"}), dims, 2),
      "job.yaml: parallel.tp=2 neither divides the model's 3 kv heads nor is a multiple of them; valid tp: "
      "1, 3, 6");
  // tp 6 is a multiple of the 3 kv heads: each is replicated on 2 ranks.
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=6", "training.micro_batch_size=32"}), dims, 6));
}

TEST(ValidateParallel, TpMustDivideVocab) {
  EXPECT_EQ(error_of(job({"parallel.tp=2"}), ModelDims{4, 2, 2, 255, 2}, 2),
            "job.yaml: parallel.tp=2 does not divide the vocabulary size 255; valid tp: 1");
}

TEST(ValidateParallel, PpAtMostLayers) {
  EXPECT_EQ(
      error_of(job({"parallel.pp=3"}), kTiny, 3),
      "job.yaml: parallel.pp=3 x parallel.virtual_stages=1 = 3 pipeline stages exceeds the model's 2 blocks "
      "(each stage holds at least one); valid pp: 1 to 2");
  // The vision tower's blocks are stages' too: 2 vision and 2 LLM blocks in 4 stages, or 2 ranks x 2 chunks.
  const ModelDims with_vision{4, 2, 2, 256, 2, 4};
  EXPECT_NO_THROW(validate_parallel(job({"parallel.pp=4"}), with_vision, 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.pp=2", "parallel.virtual_stages=2"}), with_vision, 2));
  EXPECT_EQ(
      error_of(job({"parallel.pp=2", "parallel.virtual_stages=3"}), with_vision, 2),
      "job.yaml: parallel.pp=2 x parallel.virtual_stages=3 = 6 pipeline stages exceeds the model's 4 blocks "
      "(each stage holds at least one); valid pp: 1 to 1");
}

TEST(ValidateParallel, PipelineKeysNeedAPipeline) {
  EXPECT_EQ(
      error_of(job({"parallel.virtual_stages=2"}), kTiny, 1),
      "job.yaml: parallel.virtual_stages=2 needs parallel.pp > 1 (it cuts each pipeline rank's layers into "
      "chunks)");
  EXPECT_EQ(
      error_of(job({"parallel.pipeline_schedule=gpipe"}), kTiny, 1),
      "job.yaml: parallel.pipeline_schedule=gpipe: only read with parallel.pp > 1 (remove it, or set pp)");
  EXPECT_EQ(error_of(job({"features.recompute_in_bubbles=true"}), kTiny, 1),
            "job.yaml: features.recompute_in_bubbles: only read with parallel.pp > 1 (remove it, or set pp)");
  EXPECT_EQ(error_of(job({"model.pipeline_layers={llm: [2]}"}), kTiny, 1),
            "job.yaml: model.pipeline_layers: only read with parallel.pp > 1 (remove it, or set pp)");
  // 32 / 8 = 4 micro-batches per step: not whole groups of 3 for the interleaved schedule.
  EXPECT_EQ(
      error_of(job({"parallel.pp=3", "parallel.virtual_stages=2"}), ModelDims{4, 2, 2, 256, 2, 6}, 3),
      "job.yaml: parallel.virtual_stages=2: the interleaved schedule takes micro-batches in groups of "
      "parallel.pp=3, but a step has 4 per rank (global_batch_size / (micro_batch_size*dp) = 32 / (8*1))");
}

TEST(ValidateParallel, WorldSizeMustBeTheProduct) {
  EXPECT_EQ(error_of(job({"parallel.pp=2"}), kTiny, 3),
            "job.yaml: parallel.dp=auto: world size 3 is not divisible by tp*cp*pp = 1*1*2 = 2");
  EXPECT_EQ(error_of(job({"parallel.dp=2"}), kTiny, 4),
            "job.yaml: parallel: tp*cp*pp*dp = 1*1*1*2 = 2 does not equal the world size 4");
  EXPECT_EQ(error_of(job({"parallel.dp=2", "parallel.tp=2"}), kTiny, 2),
            "job.yaml: parallel: tp*cp*pp*dp = 2*1*1*2 = 4 does not equal the world size 2");
}

TEST(ValidateParallel, GlobalBatchDividesIntoMicroBatchesPerRank) {
  EXPECT_EQ(error_of(job({}), kTiny, 3),
            "job.yaml: training.global_batch_size=32 is not divisible by micro_batch_size*dp = 8*3 = 24");
  EXPECT_EQ(error_of(job({"training.global_batch_size=12", "training.micro_batch_size=8"}), kTiny, 1),
            "job.yaml: training.global_batch_size=12 is not divisible by micro_batch_size*dp = 8*1 = 8");
}

// The tiny model with a mixture of 6 experts in its layers.
ModelDims with_experts(int64_t experts) {
  ModelDims dims = kTiny;
  dims.experts = experts;
  return dims;
}

TEST(ValidateParallel, ExpertAndSequenceParallelShapes) {
  EXPECT_EQ(error_of(job({"parallel.ep=3", "parallel.dp=2"}), with_experts(6), 2),
            "job.yaml: parallel.ep=3 does not divide dp*cp = 2*1 = 2 (expert ranks are carved from them)");
  EXPECT_EQ(
      error_of(job({"parallel.sequence_parallel=true"}), kTiny, 1),
      "job.yaml: parallel.sequence_parallel=true needs parallel.tp > 1 (it splits the sequence across tp "
      "ranks)");
}

TEST(ValidateParallel, ExpertParallelLayouts) {
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2"}), with_experts(8), 2));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=4"}), with_experts(8), 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2"}), with_experts(8), 4));  // 2 expert-data ranks
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2", "parallel.zero=1"}), with_experts(8), 4));
  EXPECT_EQ(
      error_of(job({"parallel.ep=2"}), kTiny, 2),
      "job.yaml: parallel.ep=2: this model has no experts to split over expert-parallel ranks (use ep 1)");
  EXPECT_EQ(error_of(job({"parallel.ep=3"}), with_experts(8), 3),
            "job.yaml: parallel.ep=3 does not divide the model's 8 experts");
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2", "parallel.zero=3"}), with_experts(8), 4));
  EXPECT_EQ(
      error_of(job({"parallel.ep=2", "parallel.zero=3", "parallel.tp=2"}), with_experts(8), 8),
      "job.yaml: parallel.ep=2 with parallel.zero=3 and parallel.tp=2: expert parallelism under FSDP runs "
      "beside data parallelism only in this version of Loom");
  EXPECT_NO_THROW(
      validate_parallel(job({"parallel.ep=2", "parallel.tp=2", "parallel.zero=1"}), with_experts(8), 8));
  EXPECT_NO_THROW(
      validate_parallel(job({"parallel.ep=2", "parallel.tp=2", "parallel.pp=2"}), with_experts(8), 8));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2", "parallel.tp=2"}), with_experts(8), 4));
  // Beside pipeline and context parallelism: the ep ranks carved from each stage's dp x cp ranks.
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2", "parallel.pp=2"}), with_experts(8), 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.ep=2", "parallel.cp=2"}), with_experts(8), 2));
}

TEST(ValidateParallel, RoutingChoicesNeedExperts) {
  EXPECT_NO_THROW(validate_parallel(job({"training.moe_capacity_factor=1.5", "training.moe_z_loss=0.001",
                                         "training.moe_expert_bias_rate=0.001"}),
                                    with_experts(8), 1));
  EXPECT_EQ(error_of(job({"training.moe_z_loss=0.001"}), kTiny, 1),
            "job.yaml: training.moe_z_loss=0.001: this model has no experts to route to (remove it)");
  EXPECT_EQ(error_of(job({"training.moe_capacity_factor=2"}), kTiny, 1),
            "job.yaml: training.moe_capacity_factor=2: this model has no experts to route to (remove it)");
  EXPECT_NO_THROW(
      validate_parallel(job({"parallel.ep=2", "parallel.hot_expert_threshold=1.5"}), with_experts(8), 2));
  EXPECT_EQ(
      error_of(job({"parallel.hot_expert_threshold=1.5"}), with_experts(8), 2),
      "job.yaml: parallel.hot_expert_threshold=1.5: only read with parallel.ep > 1 (remove it, or set ep)");
  EXPECT_NE(error_of(job({"parallel.ep=2", "parallel.hot_expert_threshold=0.5"}), with_experts(8), 2)
                .find("use 0 (off) or a value >= 1"),
            std::string::npos);
}

TEST(ValidateParallel, TensorParallelLayoutsPass) {
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=2"}), kTiny, 2));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=2", "parallel.sequence_parallel=true"}), kTiny, 2));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=2", "training.micro_batch_size=16"}), kTiny, 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=2", "parallel.vision_tp=1"}), kTiny, 2));
  EXPECT_EQ(data_parallel_size(job({"parallel.tp=2"}).parallel, 4), 2);
  // 2D layouts: ZeRO-1 and FSDP over the data-parallel ranks of tensor-parallel slices.
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=2", "parallel.zero=1"}), kTiny, 4));
  EXPECT_NO_THROW(validate_parallel(
      job({"parallel.tp=2", "parallel.zero=3", "parallel.sequence_parallel=true"}), kTiny, 4));
}

TEST(ValidateParallel, VisionTpIsOneOrTp) {
  // 4 LLM heads, 1 vision head: the tower cannot split over 2 ranks but may stay whole.
  const ModelDims dims{4, 2, 1, 256, 2};
  EXPECT_EQ(error_of(job({"parallel.tp=2"}), dims, 2),
            "job.yaml: parallel.tp=2 does not divide model heads (llm 4, vision 1); valid tp: 1");
  EXPECT_NO_THROW(validate_parallel(job({"parallel.tp=2", "parallel.vision_tp=1"}), dims, 2));
  try {
    job({"parallel.tp=2", "parallel.vision_tp=3"});
    ADD_FAILURE() << "expected a ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_STREQ(e.what(),
                 "--set parallel.vision_tp=3: must be 1 (the vision tower whole on every tensor-parallel "
                 "rank) or tp (2), or 0 for the same as tp; got 3");
  }
}

TEST(ValidateParallel, UnbuiltParallelismIsRefused) {
  EXPECT_NO_THROW(validate_parallel(job({"parallel.pp=2"}), kTiny, 2));
  EXPECT_NO_THROW(
      validate_parallel(job({"parallel.pp=2", "parallel.zero=1", "training.micro_batch_size=4"}), kTiny, 4));
  EXPECT_NO_THROW(
      validate_parallel(job({"parallel.pp=2", "parallel.zero=3", "training.micro_batch_size=4"}), kTiny, 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.cp=2", "parallel.pp=2"}), kTiny, 4));
  // Expert parallelism under FSDP: beside data parallelism only.
  EXPECT_NE(error_of(job({"parallel.ep=2", "parallel.zero=3", "parallel.cp=2"}), with_experts(8), 4)
                .find("parallel.ep=2 with parallel.zero=3 and parallel.cp=2: expert parallelism under FSDP"),
            std::string::npos);
  EXPECT_EQ(
      error_of(job({"parallel.ep=2", "parallel.zero=3", "parallel.pp=2"}), with_experts(8), 4),
      "job.yaml: parallel.ep=2 with parallel.zero=3 and parallel.pp=2: expert parallelism under FSDP runs "
      "beside data parallelism only in this version of Loom");
}

// Context parallelism: any cp that divides the world; Ulysses groups that divide cp and split the
// heads per tensor-parallel rank (key/value heads fewer than the degree dividing it).
TEST(ValidateParallel, ContextParallelDegrees) {
  const ModelDims dims{8, 2, 4, 256, 2};  // llm 8 heads, 2 kv heads, vision 4 heads
  EXPECT_NO_THROW(validate_parallel(job({"parallel.cp=4"}), dims, 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.cp=4", "parallel.cp_ulysses=4"}), dims, 4));
  EXPECT_NO_THROW(validate_parallel(job({"parallel.cp=4", "parallel.cp_ulysses=2"}), dims, 8));
  EXPECT_NO_THROW(
      validate_parallel(job({"parallel.cp=2", "parallel.cp_ulysses=2", "parallel.tp=2"}), dims, 4));
  EXPECT_EQ(
      error_of(job({"parallel.cp=4", "parallel.cp_ulysses=3"}), dims, 4),
      "job.yaml: parallel.cp_ulysses=3 does not divide parallel.cp=4 (the cp ranks form Ulysses groups of "
      "cp_ulysses ranks and rings across them: 1 for a ring, cp for Ulysses alone)");
  EXPECT_EQ(
      error_of(job({"parallel.cp=8", "parallel.cp_ulysses=8"}), dims, 8),
      "job.yaml: parallel.cp_ulysses=8 does not split the attention heads per tensor-parallel rank (llm 8, "
      "its key/value heads 2, vision 4) evenly over the Ulysses ranks");
  EXPECT_EQ(error_of(job({"parallel.cp=3"}), dims, 4),
            "job.yaml: parallel.dp=auto: world size 4 is not divisible by tp*cp*pp = 1*3*1 = 3");
}

// Dynamic context parallelism: cp is its largest degree and the per-rank token budget is required.
TEST(ValidateParallel, DynamicContextParallel) {
  const ModelDims dims{8, 2, 4, 256, 2};
  EXPECT_NO_THROW(validate_parallel(
      job({"parallel.cp=4", "parallel.dynamic_cp=true", "parallel.dynamic_cp_tokens=512"}), dims, 8));
  EXPECT_EQ(
      error_of(job({"parallel.dynamic_cp=true", "parallel.dynamic_cp_tokens=512"}), dims, 2),
      "job.yaml: parallel.dynamic_cp=true needs parallel.cp > 1 (the largest degree a step may run at)");
  EXPECT_EQ(
      error_of(job({"parallel.cp=2", "parallel.dynamic_cp=true"}), dims, 2),
      "job.yaml: parallel.dynamic_cp=true needs parallel.dynamic_cp_tokens >= 1 (the most tokens of one "
      "sample a rank holds: each step's degree is the smallest whose ranks hold its longest sample "
      "within it)");
  EXPECT_EQ(error_of(job({"parallel.cp=2", "parallel.dynamic_cp_tokens=512"}), dims, 2),
            "job.yaml: parallel.dynamic_cp_tokens=512: only read with parallel.dynamic_cp=true");
}

TEST(ValidateParallel, BadInputs) {
  EXPECT_EQ(error_of(job({}), kTiny, 0), "job.yaml: world size must be >= 1, got 0");
  EXPECT_THAT(error_of(job({}), ModelDims{4, 0, 2, 256, 2}, 1), HasSubstr("model sizes must be positive"));
}

}  // namespace
}  // namespace loom::config
