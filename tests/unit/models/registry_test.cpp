// The family registry: every folder's families registered once, model.family checked against them,
// and a model directory or published name told to its family.
#include "loom/models/registry.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "loom/util/errors.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

using testing::message_of;

TEST(FamilyRegistry, EveryFamilyOnceWithItsKind) {
  EXPECT_EQ(family_names(), (std::vector<std::string>{"qwen2_vl", "qwen2_5_vl", "umt5", "wan", "wan_vae",
                                                      "internvl", "qwen3_5", "qwen3_5_moe"}));
  EXPECT_EQ(family_names(ModelKind::vision_language),
            (std::vector<std::string>{"qwen2_vl", "qwen2_5_vl", "internvl", "qwen3_5", "qwen3_5_moe"}));
  EXPECT_EQ(family_names(ModelKind::denoiser), (std::vector<std::string>{"wan"}));
  EXPECT_EQ(family_names(ModelKind::latent_codec), (std::vector<std::string>{"wan_vae"}));
  EXPECT_EQ(family_names(ModelKind::text_encoder), (std::vector<std::string>{"umt5"}));
  for (const Family& family : families()) {
    EXPECT_TRUE(family.owns && family.build && family.init && family.load) << family.name;
    EXPECT_FALSE(family.presets.empty()) << family.name;
    for (const auto& preset : family.presets)
      EXPECT_TRUE(family.owns(family.preset_config(preset))) << family.name << " " << preset;
  }
}

TEST(FamilyRegistry, AnUnknownFamilyIsNamedWithTheValidOnes) {
  EXPECT_EQ(
      message_of<ConfigError>([] { family_named("llama"); }),
      "model.family: 'llama' is not one of qwen2_vl, qwen2_5_vl, umt5, wan, wan_vae, internvl, qwen3_5, "
      "qwen3_5_moe");
  EXPECT_EQ(&family_named("wan"), &families()[3]);
}

TEST(FamilyRegistry, ModelsAreToldToTheirFamily) {
  EXPECT_EQ(find_model("qwen2.5-vl-3b").family->name, "qwen2_5_vl");
  EXPECT_EQ(find_model("umt5-xxl").family->name, "umt5");
  EXPECT_EQ(find_model(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-tiny").family->name,
            "qwen2_vl");
  EXPECT_EQ(find_model(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/wan-tiny/dit").family->name, "wan");
  EXPECT_EQ(find_model("internvl3.5-1b").family->name, "internvl");
  EXPECT_EQ(find_model(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/internvl-tiny/qwen3").family->name,
            "internvl");
  EXPECT_EQ(find_model(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/dense").family->name,
            "qwen3_5");
  EXPECT_EQ(find_model(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/qwen3_5/moe").family->name,
            "qwen3_5_moe");
}

}  // namespace
}  // namespace loom::models
