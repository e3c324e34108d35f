// Job assembly: a task trains the families of its kind and refuses the others by name, and an unknown
// family is refused before anything is built.
#include "loom/tasks/registry.h"

#include <gtest/gtest.h>

#include <string>

#include "loom/config/config.h"
#include "loom/util/errors.h"

namespace loom::tasks {
namespace {

std::string layout_error(const std::string& yaml) {
  try {
    validate_layout(config::parse_config(yaml, "job.yaml"), 1);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(JobAssembly, ATaskTrainsTheFamiliesOfItsKind) {
  EXPECT_EQ(layout_error("model: {family: wan, hf_config: wan2.1-t2v-1.3b}\ntraining: {steps: 1}\n"),
            "training.task: vlm_sft trains model.family qwen2_vl or qwen2_5_vl or internvl or qwen3_5 or "
            "qwen3_5_moe, not wan");
  EXPECT_EQ(layout_error("model: {family: qwen2_vl, hf_config: qwen2-vl-2b}\n"
                         "training: {steps: 1, task: vae}\n"),
            "training.task: vae trains model.family wan_vae, not qwen2_vl");
  EXPECT_EQ(
      layout_error("model: {family: llama, hf_config: a.json}\ntraining: {steps: 1}\n"),
      "model.family: 'llama' is not one of qwen2_vl, qwen2_5_vl, umt5, wan, wan_vae, internvl, qwen3_5, "
      "qwen3_5_moe");
  EXPECT_EQ(layout_error("model: {family: qwen2_vl, hf_config: qwen2-vl-2b}\ntraining: {steps: 1}\n"), "");
}

}  // namespace
}  // namespace loom::tasks
