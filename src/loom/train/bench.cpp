// loom bench: the trainer's steps, timed.
#include <ATen/record_function.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <optional>
#include <string>

#include "loom/core/device.h"
#include "loom/memory/counting_allocator.h"
#include "loom/parallel/context/ring.h"
#include "loom/parallel/expert.h"
#include "loom/train/flops.h"
#include "loom/train/profile.h"
#include "loom/train/schedule.h"
#include "loom/train/step_feed.h"
#include "loom/train/trainer.h"
#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::train {

BenchResult Trainer::bench(int64_t warmup, int64_t steps, const std::string& profile) {
  if (warmup < 0 || steps < 1)
    throw ConfigError(fmt::format("bench: needs steps >= 1 and warmup >= 0, got {} and {}", steps, warmup));
  const auto& t = job_.training;
  const at::Device device = parts_.layout.device;
  peak_flops_ = job_peak_flops(t.peak_tflops, device);
  const core::Task& task = *parts_.task;
  StepFeed loader(task, job_.data, device, 0, warmup + steps);
  BenchResult r;
  r.steps = steps;
  r.warmup = warmup;
  r.ranks = plan_.state->sizes().dp;
  r.sgemm_gflops = peak_flops_ / 1e9;
  r.device = core::device_name(device);
  memory::CountingAllocator* counter = memory::CountingAllocator::installed();
  std::vector<double> step_times;
  double tokens = 0, samples = 0, flops = 0;
  BenchResult::PipelineRank mine;  // this rank's share of the pipeline figures
  std::optional<Profile> recording;
  parallel::reset_expert_stats();
  for (int64_t i = 0; i < warmup + steps; ++i) {
    if (i == warmup && !profile.empty()) recording.emplace(profile, device);
    const std::string step_name = fmt::format("step {}", i + 1);
    RECORD_USER_SCOPE(step_name.c_str());
    const auto begin = Clock::now();
    if (counter) counter->reset_peak();
    if (i == warmup) core::reset_peak_memory(device);
    const double wait_before = loader.wait_seconds();
    const core::StepData step = loader.next();
    const double data_wait = loader.wait_seconds() - wait_before;
    const StepStats stats = train_step(step);
    const auto optimizer_begin = Clock::now();
    {
      RECORD_USER_SCOPE("optimizer");
      plan_.optimizer->step(learning_rate(i, t.steps, t.warmup_steps, t.lr, t.min_lr));
    }
    core::synchronize(device);  // a GPU's queued work belongs to this step's time
    const double optimizer_s = seconds_since(optimizer_begin), seconds = seconds_since(begin);
    if (i + 1 == warmup) {
      parallel::reset_ring_stats();
      parallel::reset_expert_stats();
    }
    if (i < warmup) continue;
    if (counter) r.peak_allocated_bytes = std::max(r.peak_allocated_bytes, counter->peak_bytes());
    r.activation_bytes = std::max(r.activation_bytes, stats.activation_bytes);
    r.micro_batches = static_cast<int64_t>(step.micro_batches.size());
    mine.busy_s += stats.forward_s + stats.backward_s;
    mine.idle_s += stats.receive_wait_s;
    mine.activation_bytes = std::max(mine.activation_bytes, stats.activation_bytes);
    step_times.push_back(seconds);
    r.total_s += seconds;
    r.data_s += data_wait;
    r.forward_s += stats.forward_s;
    r.backward_s += stats.backward_s;
    r.optimizer_s += optimizer_s;
    r.communication_s += stats.grad_sync_s;
    tokens += static_cast<double>(stats.tokens);
    samples += static_cast<double>(stats.samples);
    flops += stats.flops;
    if (!stats.expert_tokens.empty()) {
      r.expert_tokens.resize(stats.expert_tokens.size(), 0.0);
      for (size_t e = 0; e < stats.expert_tokens.size(); ++e) r.expert_tokens[e] += stats.expert_tokens[e];
    }
  }
  if (recording) recording->finish();
  std::sort(step_times.begin(), step_times.end());
  r.step_time_median_s = step_times[step_times.size() / 2];
  r.tokens_per_s = tokens / r.total_s;
  r.samples_per_s = samples / r.total_s;
  r.mfu = mfu(flops, r.total_s);
  if (const auto& pipeline = plan_.state->pp()) {
    // Every rank's figures, in pipeline-rank order: each fills its own row of one sum.
    const int64_t ranks = pipeline->size();
    at::Tensor rows = at::zeros({ranks, 3}, at::kDouble);
    rows[pipeline->rank()][0] = mine.busy_s;
    rows[pipeline->rank()][1] = mine.idle_s;
    rows[pipeline->rank()][2] = static_cast<double>(mine.activation_bytes);
    pipeline->all_reduce_sum({rows});
    for (int64_t i = 0; i < ranks; ++i)
      r.pipeline.push_back(
          {rows[i][0].item<double>(), rows[i][1].item<double>(), rows[i][2].item<int64_t>()});
    r.virtual_stages = job_.parallel.virtual_stages;
  }
  if (const auto& cp = plan_.state->cp()) {
    const parallel::RingStats ring = parallel::ring_stats();
    const double alone = parallel::time_ring_messages_alone();
    at::Tensor rows = at::zeros({cp->size(), 5}, at::kDouble);
    rows[cp->rank()][0] = static_cast<double>(mine.activation_bytes);
    rows[cp->rank()][1] = ring.compute_s;
    rows[cp->rank()][2] = ring.wait_s;
    rows[cp->rank()][3] = alone;
    rows[cp->rank()][4] = static_cast<double>(ring.bytes);
    cp->all_reduce_sum({rows});
    for (int64_t i = 0; i < cp->size(); ++i)
      r.context.push_back({static_cast<int64_t>(rows[i][0].item<double>()), rows[i][1].item<double>(),
                           rows[i][2].item<double>(), rows[i][3].item<double>(),
                           static_cast<int64_t>(rows[i][4].item<double>())});
    r.cp_ulysses = job_.parallel.cp_ulysses;
  }
  if (parts_.model->experts() > 0) {
    const parallel::ExpertStats expert = parallel::expert_stats();
    const double alone = parallel::time_expert_messages_alone();
    const std::shared_ptr<dist::Comm> ep = plan_.state->ep();
    const int64_t ranks = ep ? ep->size() : 1, me = ep ? ep->rank() : 0;
    at::Tensor rows = at::zeros({ranks, 6}, at::kDouble);
    rows[me][0] = static_cast<double>(expert.rows);
    rows[me][1] = static_cast<double>(expert.bytes);
    rows[me][2] = expert.compute_s;
    rows[me][3] = expert.flops;
    rows[me][4] = expert.wait_s;
    rows[me][5] = alone;
    if (ep) ep->all_reduce_sum({rows});
    for (int64_t i = 0; i < ranks; ++i)
      r.experts.push_back({static_cast<int64_t>(rows[i][0].item<double>()),
                           static_cast<int64_t>(rows[i][1].item<double>()), rows[i][2].item<double>(),
                           rows[i][3].item<double>(), rows[i][4].item<double>(), rows[i][5].item<double>()});
  }
  const core::DeviceMemory memory = core::device_memory(device);
  r.device_peak_allocated_bytes = memory.peak_allocated;
  r.device_peak_reserved_bytes = memory.peak_reserved;
  r.parameter_bytes = plan_.bytes.parameters;
  r.gradient_bytes = plan_.bytes.gradients;
  r.optimizer_bytes = plan_.bytes.optimizer;
  struct rusage usage {};
  ::getrusage(RUSAGE_SELF, &usage);
  r.peak_rss_mib = static_cast<double>(usage.ru_maxrss) / 1024.0;  // KiB on Linux
  return r;
}

}  // namespace loom::train
