// The vae task's training loss, recomputed here from the model's own outputs on the same micro-batch:
// the reconstruction error summed over the pixels (squared under reconstruction_loss: mse, absolute
// under l1) plus kl_weight x the posterior's KL divergence from N(0, I) summed over the latent elements.
#include <gtest/gtest.h>

#include <string>

#include "loom/config/config.h"
#include "loom/core/layer.h"
#include "loom/models/wan/vae.h"
#include "loom/tasks/registry.h"
#include "loom/tasks/vae/task.h"

namespace loom::tasks {
namespace {

const std::string kJob =
    "model:\n"
    "  family: wan_vae\n"
    "  hf_config: {dim: 4, z_dim: 4, dim_mult: [1, 2, 2, 2], num_res_blocks: 1, attn_scales: [],\n"
    "              temperal_downsample: [false, true, true]}\n"
    "data: {dataset: moving_fashion, video_size: 40, frames: 5, eval_samples: 1, num_workers: 0}\n"
    "training: {task: vae, steps: 1, global_batch_size: 2, micro_batch_size: 2, kl_weight: 0.25}\n";

// The loss of step 0's one micro-batch, and the same recomputed from the decoded clip, mu and log_var.
std::pair<double, double> task_and_recomputed_loss(const std::string& kind) {
  const config::JobConfig job =
      config::parse_config(kJob, "job.yaml", {"training.reconstruction_loss=" + kind});
  const BuiltJob built = build_job(job, nullptr);
  const core::StepData data = built.task->step_data(0);
  EXPECT_EQ(data.micro_batches.size(), 1u);
  const auto& batch = static_cast<const VaeMicroBatch&>(*data.micro_batches.at(0));
  const core::Stage stage{built.model->layers(), {}, true, true};
  const double loss = built.task->forward(batch, stage, {}).loss_sum.item<double>();

  models::WanVaeContext context;
  context.video = batch.video;
  context.noise = batch.noise;
  const core::Carry carry = core::run_layers(built.model->layers(), {}, context);
  const at::Tensor error = carry.get("hidden").to(at::kDouble) - batch.video.to(at::kDouble);
  const at::Tensor mu = carry.get("mu").to(at::kDouble), log_var = carry.get("log_var").to(at::kDouble);
  const double reconstruction = (kind == "l1" ? error.abs().sum() : error.pow(2).sum()).item<double>();
  const double kl = (0.5 * (mu.pow(2) + log_var.exp() - 1.0 - log_var).sum()).item<double>();
  return {loss, reconstruction + 0.25 * kl};
}

TEST(VaeTask, TheLossIsTheChosenReconstructionErrorPlusTheWeightedKl) {
  const auto [mse, mse_recomputed] = task_and_recomputed_loss("mse");
  EXPECT_NEAR(mse, mse_recomputed, 1e-5 * mse_recomputed);
  const auto [l1, l1_recomputed] = task_and_recomputed_loss("l1");
  EXPECT_NEAR(l1, l1_recomputed, 1e-5 * l1_recomputed);
  // The same weights and clips (one seed): only the reconstruction error's kind differs.
  EXPECT_GT(std::abs(l1 - mse), 1e-3 * mse);
}

}  // namespace
}  // namespace loom::tasks
