// Supervised fine-tuning of a vision-language model (task: vlm_sft): conversations through the
// chat template, the loss the mean next-token cross-entropy over every target token of the global
// batch, evaluation by greedy answers scored by exact match and by the held-out loss and perplexity
// (overall and per question type), and the tokenizer and HF files carried in every checkpoint.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/core/task.h"
#include "loom/data/batching.h"
#include "loom/models/vision_language.h"
#include "loom/tasks/vlm_sft/job_data.h"

namespace loom::tasks {

// One micro-batch of token rows with their images.
struct VlmMicroBatch : core::MicroBatch {
  data::Batch batch;
  int64_t context_parallel = 0;  // the degree its tokens are split over (0: the job's parallel.cp)
  // The images and the labels; the token ids and the mask stay on the host, where positions and
  // counts are worked out from them.
  std::vector<at::Tensor*> device_inputs() override {
    return {&batch.pixel_values, &batch.pixel_values_videos, &batch.labels};
  }
};

// A collated or packed batch as the model's inputs.
models::VisionLanguageInputs model_inputs(const data::Batch& batch);

class VlmSftTask : public core::Task {
 public:
  // Reads the job's data, its images made by the model's `processor` (ConfigError when the model's
  // special token ids are not the tokenizer's), shared out over layout.data(); a training pass splits
  // each sample's tokens over the group of `context_parallel` (parallel::context_parallel_degrees) at
  // its step's degree.
  VlmSftTask(const config::JobConfig& job, std::shared_ptr<models::VisionLanguageModel> model,
             const core::Layout& layout, std::map<int64_t, parallel::ContextParallelGroup> context_parallel,
             std::unique_ptr<data::ImageProcessor> processor);

  core::StepData step_data(int64_t step) const override;
  std::string loss_count_name() const override { return "target tokens"; }
  core::ForwardResult forward(const core::MicroBatch& batch, const core::Stage& stage,
                              core::Carry input) override;
  // Greedy answers to the held-out prompts (batches dealt round-robin over the data-parallel ranks),
  // exact match against the reference; every rank gets the whole result.
  core::Evaluation evaluate(int64_t step) override;
  // The tokenizer, in the form the data section reads back, and the files transformers reads beside
  // the weights (hf_files.h); generation_config.json is init_from's when it has one.
  void save_artifacts(const std::string& dir) const override;
  int64_t epoch_samples() const override;

  // input_ids, labels, attention_mask, the model's position_ids, pixel_values and image_grid_thw,
  // pixel_values_videos, video_grid_thw and second_per_grid_ts (float64)
  // (with images), cu_seqlens (packed).
  std::vector<std::pair<std::string, at::Tensor>> export_step(int64_t step) const override;

  // Step `step`'s micro-batches for one process holding the whole global batch.
  std::vector<data::Batch> whole_step(int64_t step) const;

 private:
  // The held-out loss by question type: the sum of the answer tokens' cross-entropy and their count
  // (the training loss's formula), over every rank's share of the held-out set (a collective).
  std::map<std::string, std::pair<double, int64_t>> held_out_loss() const;
  // A step's usable samples (DataError when none is), with their counts on data rank 0.
  std::vector<data::TokenizedExample> step_samples(int64_t step, core::StepData* counts) const;
  // Dynamic context parallelism: the degree step `step` of `samples` runs at (DataError when even
  // parallel.cp ranks cannot hold its longest sample within parallel.dynamic_cp_tokens each).
  int64_t dynamic_degree(int64_t step, const std::vector<data::TokenizedExample>& samples) const;

  config::DataSection data_section_;
  std::string init_from_;
  int64_t global_batch_ = 0, micro_batch_ = 0;
  int64_t dynamic_cp_tokens_ = 0;  // > 0: parallel.dynamic_cp
  std::map<int64_t, parallel::ContextParallelGroup> context_parallel_;
  std::shared_ptr<models::VisionLanguageModel> model_;
  core::Layout layout_;  // the data-parallel group shares out the steps and the held-out set
  std::unique_ptr<JobData> data_;
};

}  // namespace loom::tasks
