// WeightSource over a HuggingFace model directory: the single-file fixture, a hand-indexed
// sharded directory, and the errors for a missing file or shard.
#include <gtest/gtest.h>

#include "loom/checkpoint/safetensors.h"
#include "loom/util/errors.h"
#include "temp_dir.h"

namespace loom::checkpoint {
namespace {

using testing::expect_checkpoint_error;

using testing::TempDir;
using testing::write_bytes;

TEST(WeightSource, ReadsSingleFileDirectory) {
  const std::string dir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-tiny";
  WeightSource source(dir);
  const std::vector<std::string> names = source.names();
  EXPECT_EQ(names.size(), 58u);
  EXPECT_TRUE(std::is_sorted(names.begin(), names.end()));
  EXPECT_TRUE(source.contains("model.embed_tokens.weight"));
  EXPECT_EQ(source.shape("visual.patch_embed.proj.weight"), (std::vector<int64_t>{32, 3, 2, 14, 14}));
  EXPECT_EQ(source.dtype("lm_head.weight"), at::kFloat);
  EXPECT_EQ(source.file_of("lm_head.weight"), dir + "/model.safetensors");
  EXPECT_TRUE(source.load("lm_head.weight")
                  .equal(SafetensorsReader(dir + "/model.safetensors").load("lm_head.weight")));
  expect_checkpoint_error([&] { source.load("model.absent"); }, {dir, "'model.absent'"});
}

// Two shards plus an index in HuggingFace's format, written here by hand.
void write_sharded(const TempDir& dir, const std::string& index_text) {
  save_safetensors(
      dir.file("model-00001-of-00002.safetensors"),
      {{"embed.weight", at::arange(6, at::kFloat).reshape({2, 3})}, {"norm.weight", at::ones({3})}});
  save_safetensors(dir.file("model-00002-of-00002.safetensors"),
                   {{"head.weight", at::full({3, 2}, -1.5, at::kBFloat16)}});
  write_bytes(dir.file("model.safetensors.index.json"), index_text);
}

const char* kIndex = R"({
  "metadata": {"total_size": 48},
  "weight_map": {
    "embed.weight": "model-00001-of-00002.safetensors",
    "head.weight": "model-00002-of-00002.safetensors",
    "norm.weight": "model-00001-of-00002.safetensors"
  }
})";

TEST(WeightSource, ReadsShardedDirectory) {
  TempDir dir;
  write_sharded(dir, kIndex);
  WeightSource source(dir.path().string());
  EXPECT_EQ(source.names(), (std::vector<std::string>{"embed.weight", "head.weight", "norm.weight"}));
  EXPECT_TRUE(source.load("embed.weight").equal(at::arange(6, at::kFloat).reshape({2, 3})));
  EXPECT_TRUE(source.load("norm.weight").equal(at::ones({3})));
  at::Tensor head = source.load("head.weight");
  EXPECT_EQ(head.scalar_type(), at::kBFloat16);
  EXPECT_TRUE(head.equal(at::full({3, 2}, -1.5, at::kBFloat16)));
  EXPECT_EQ(source.shape("head.weight"), (std::vector<int64_t>{3, 2}));
  EXPECT_EQ(source.file_of("head.weight"), dir.file("model-00002-of-00002.safetensors"));
  EXPECT_FALSE(source.contains("lm_head.weight"));
}

TEST(WeightSource, NamesMissingShardAndMissingTensor) {
  {
    TempDir dir;
    write_sharded(dir, kIndex);
    std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
    expect_checkpoint_error([&] { WeightSource source(dir.path().string()); },
                            {"model.safetensors.index.json", dir.file("model-00002-of-00002.safetensors"),
                             "'head.weight'", "does not exist"});
  }
  {
    TempDir dir;
    write_sharded(dir, R"({"weight_map": {"embed.weight": "model-00001-of-00002.safetensors",
                                         "extra.weight": "model-00002-of-00002.safetensors"}})");
    expect_checkpoint_error([&] { WeightSource source(dir.path().string()); },
                            {"'extra.weight'", "model-00002-of-00002.safetensors", "does not hold it"});
  }
  {
    TempDir dir;
    write_sharded(dir, R"({"metadata": {}})");
    expect_checkpoint_error([&] { WeightSource source(dir.path().string()); }, {"weight_map"});
  }
}

TEST(WeightSource, NamesDirectoryWithoutWeights) {
  TempDir dir;
  expect_checkpoint_error([&] { WeightSource source(dir.path().string()); },
                          {dir.path().string(), "model.safetensors.index.json", "model.safetensors"});
}

}  // namespace
}  // namespace loom::checkpoint
