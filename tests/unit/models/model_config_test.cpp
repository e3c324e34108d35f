// What a model config and its weights may not smuggle in: a norm eps that is not positive, a
// model.hf_config that disagrees with init_from's own config.json (or a config.json that is not
// JSON), and a tensor whose stored dtype is of another kind than its parameter's.
#include <gtest/gtest.h>
#include <stdlib.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/checkpoint/safetensors.h"
#include "loom/config/config.h"
#include "loom/models/qwen2_vl/spec.h"
#include "loom/models/weights.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"
#include "reference_fixture.h"

namespace loom::models {
namespace {

namespace fs = std::filesystem;
using testing::message_of;

const std::string kDir = std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-tiny";

nlohmann::json fixture_config() {
  std::ifstream in(kDir + "/config.json");
  return nlohmann::json::parse(in);
}

// A copy of the fixture's model directory, removed at the end of the test.
class ModelCopy {
 public:
  ModelCopy() {
    std::string pattern = (fs::temp_directory_path() / "loom-model-config-test-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("mkdtemp failed");
    dir_ = pattern;
    for (const char* name : {"config.json", "model.safetensors"})
      fs::copy_file(kDir + "/" + name, dir_ + "/" + name);
  }
  ~ModelCopy() {
    std::error_code error;
    remove_tree(dir_, error);
  }
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
};

// rms_norm_eps: -1 was accepted, and the loss was NaN from step 2.
TEST(ModelConfig, NormEpsAndRopeThetaMustBePositive) {
  for (const char* key : {"rms_norm_eps", "rope_theta"})
    for (double value : {-1.0, 0.0}) {
      nlohmann::json hf = fixture_config();
      hf[key] = value;
      const std::string message =
          message_of<ConfigError>([&] { parse_qwen2vl_config(hf, "qwen2_vl", "config.json"); });
      EXPECT_NE(message.find(std::string("config.json: ") + key + ": must be > 0"), std::string::npos)
          << message;
    }
}

config::JobConfig job_with(const nlohmann::json& hf_config, const std::string& init_from) {
  config::JobConfig job;
  job.source = "job.yaml";
  job.model.family = "qwen2_vl";
  job.model.hf_config = hf_config;
  job.model.init_from = init_from;
  return job;
}

// init_from's config.json was never read when model.hf_config was given: the weights loaded into
// whatever architecture hf_config described, as long as the shapes happened to fit.
TEST(ModelConfig, HfConfigMustAgreeWithInitFromsConfig) {
  ModelCopy copy;
  EXPECT_EQ(job_model_config(job_with(fixture_config(), copy.dir())).text.num_layers, 2);
  nlohmann::json eps = fixture_config();
  eps["rms_norm_eps"] = 1e-5;  // same shapes, other arithmetic
  std::string message = message_of<ConfigError>([&] { job_model_config(job_with(eps, copy.dir())); });
  EXPECT_NE(message.find("model.hf_config disagrees with " + copy.dir() + "/config.json"), std::string::npos)
      << message;
  EXPECT_NE(message.find("rms_norm_eps is 1e-06 there and 1e-05 in model.hf_config"), std::string::npos)
      << message;
  nlohmann::json vision = fixture_config();
  vision["vision_config"]["depth"] = 3;
  message = message_of<ConfigError>([&] { job_model_config(job_with(vision, copy.dir())); });
  EXPECT_NE(message.find("vision_config.depth is 2 there and 3 in model.hf_config"), std::string::npos)
      << message;
  std::ofstream(copy.dir() + "/config.json") << "{\"model_type\": \"qwen2_vl\", ";
  message = message_of<ConfigError>([&] { job_model_config(job_with(fixture_config(), copy.dir())); });
  EXPECT_NE(message.find(copy.dir() + "/config.json: not valid JSON"), std::string::npos) << message;
}

// A float tensor labelled I32 loaded as integers converted to floats.
TEST(ModelWeights, AStoredDtypeOfAnotherKindIsRefused) {
  ModelCopy copy;
  const Qwen2VLConfig config = model_config_from_dir(copy.dir());
  const std::string weights = copy.dir() + "/model.safetensors";
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  {
    const checkpoint::SafetensorsReader reader(weights);
    for (const auto& name : reader.names()) tensors.emplace_back(name, reader.load(name));
  }
  const std::string victim = "model.norm.weight";
  for (auto& [name, tensor] : tensors)
    if (name == victim) tensor = at::from_blob(tensor.data_ptr(), tensor.sizes(), at::kInt).clone();
  checkpoint::save_safetensors(weights, tensors);
  auto model = build_model(config, {});
  const std::string message = message_of<CheckpointError>([&] { load_parameters(*model, copy.dir()); });
  EXPECT_NE(message.find(weights + ": tensor '" + victim +
                         "' is stored as Int, which cannot load into the "
                         "model's Float parameter"),
            std::string::npos)
      << message;
  EXPECT_TRUE(checkpoint::loadable_as(at::kBFloat16, at::kFloat));
  EXPECT_TRUE(checkpoint::loadable_as(at::kLong, at::kInt));
  EXPECT_FALSE(checkpoint::loadable_as(at::kFloat, at::kLong));
}

}  // namespace
}  // namespace loom::models
