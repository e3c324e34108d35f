// Model converters: what a job does to its model between building it and applying the parallel plan
// (freezing modules; adapters later). They run in job assembly, so the trainer trains whatever
// parameters still require a gradient and never changes a model itself.
#pragma once
#include <memory>
#include <string>
#include <vector>

#include "loom/config/config.h"
#include "loom/core/model.h"

namespace loom::models {

class ModelConverter {
 public:
  virtual ~ModelConverter() = default;
  // The job key that asks for it, for logs and errors ("model.freeze").
  virtual std::string name() const = 0;
  // Changes `model` in place; ConfigError naming the key for a request the model cannot meet.
  virtual void convert(core::Model& model) const = 0;
};

// model.freeze: every parameter under a listed module prefix stops training. ConfigError when a
// prefix matches no parameter (listing the model's freeze_examples) or nothing is left to train.
class FreezeModules : public ModelConverter {
 public:
  explicit FreezeModules(std::vector<std::string> prefixes) : prefixes_(std::move(prefixes)) {}
  std::string name() const override { return "model.freeze"; }
  void convert(core::Model& model) const override;

 private:
  std::vector<std::string> prefixes_;
};

// The converters a job asks for, in the order they run.
std::vector<std::unique_ptr<ModelConverter>> model_converters(const config::JobConfig& job);

// Runs the job's converters over `model`.
void convert_model(core::Model& model, const config::JobConfig& job);

}  // namespace loom::models
