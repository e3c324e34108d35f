// Sizes as transformers' max_shard_size reads them, and shards that hold every tensor once, each
// under the limit unless a tensor alone exceeds it, listed by the index.
#include "loom/checkpoint/hf_export.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/safetensors.h"
#include "loom/util/errors.h"
#include "temp_dir.h"

namespace loom::checkpoint {
namespace {

TEST(HfExport, ByteSizes) {
  EXPECT_EQ(parse_byte_size("5GB", "s"), 5'000'000'000);
  EXPECT_EQ(parse_byte_size("500MB", "s"), 500'000'000);
  EXPECT_EQ(parse_byte_size("100kB", "s"), 100'000);
  EXPECT_EQ(parse_byte_size("2GiB", "s"), 2LL * 1024 * 1024 * 1024);
  EXPECT_EQ(parse_byte_size("1.5MiB", "s"), 1572864);
  EXPECT_EQ(parse_byte_size("4096", "s"), 4096);
  for (const char* bad : {"", "GB", "5XB", "-1GB", "0", "1.2.3MB"})
    EXPECT_THROW(parse_byte_size(bad, "s"), ConfigError) << bad;
}

TEST(HfExport, TorchDtypeNames) {
  EXPECT_EQ(hf_torch_dtype(at::kFloat), "float32");
  EXPECT_EQ(hf_torch_dtype(at::kBFloat16), "bfloat16");
  EXPECT_EQ(hf_torch_dtype(at::kHalf), "float16");
}

TEST(HfExport, ShardsHoldEveryTensorOnceUnderTheLimit) {
  const testing::TempDir temp;
  const std::filesystem::path dir = temp.path() / "sharded";
  std::filesystem::create_directories(dir);
  // 400, 400, 1200 (over the limit alone), 400 and 4 bytes under a 1000-byte limit.
  const std::vector<std::pair<std::string, at::Tensor>> tensors = {{"a", at::arange(100, at::kFloat)},
                                                                   {"b", at::ones({100})},
                                                                   {"c", at::zeros({300})},
                                                                   {"d", at::full({100}, 2.0)},
                                                                   {"e", at::ones({1})}};
  const auto files = save_sharded_safetensors(dir.string(), tensors, 1000);
  EXPECT_EQ(files,
            (std::vector<std::string>{"model-00001-of-00003.safetensors", "model-00002-of-00003.safetensors",
                                      "model-00003-of-00003.safetensors", "model.safetensors.index.json"}));
  std::ifstream in(dir / "model.safetensors.index.json");
  const auto index = nlohmann::json::parse(in);
  EXPECT_EQ(index["metadata"]["total_size"], 2404);
  EXPECT_EQ(index["weight_map"]["a"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["b"], "model-00001-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["c"], "model-00002-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["d"], "model-00003-of-00003.safetensors");
  EXPECT_EQ(index["weight_map"]["e"], "model-00003-of-00003.safetensors");
  const WeightSource source(dir.string());
  for (const auto& [name, t] : tensors) EXPECT_TRUE(source.load(name).equal(t)) << name;
  // Under the limit: one model.safetensors.
  const std::filesystem::path single = temp.path() / "single";
  std::filesystem::create_directories(single);
  EXPECT_EQ(save_sharded_safetensors(single.string(), tensors, 1'000'000),
            std::vector<std::string>{"model.safetensors"});
}

}  // namespace
}  // namespace loom::checkpoint
