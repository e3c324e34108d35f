// loom generate's video form: clips for a caption from a flow-matching job's denoiser checkpoint, with
// the latent codec and text encoder the job names, written as PNG frames, an animated GIF and an MP4.
#include <fmt/format.h>

#include <filesystem>
#include <memory>
#include <string>

#include "commands.h"
#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/config/config.h"
#include "loom/dist/launch_env.h"
#include "loom/models/generator.h"
#include "loom/models/registry.h"
#include "loom/tasks/flow_matching/pipeline.h"
#include "loom/tasks/flow_matching/task.h"
#include "loom/tasks/video/clips.h"
#include "loom/util/errors.h"
#include "startup.h"

namespace loom::cli {

int run_generate_video(const VideoGeneration& g) {
  if (dist::launch_env_from_process().world_size > 1)
    throw ConfigError("generate runs in one process, not under loom run");
  const config::JobConfig job = config::load_config(g.config_path, g.overrides);
  use_threads(job.training.threads, 1);
  if (job.training.task != "flow_matching" ||
      models::family_named(job.model.family).kind != models::ModelKind::denoiser)
    throw ConfigError(
        fmt::format("{}: generate makes clips with a flow_matching job's denoiser (training.task "
                    "flow_matching), not a {} job's {}",
                    g.config_path, job.training.task, job.model.family));
  const std::string checkpoint = checkpoint::resolve_model_directory(g.checkpoint);
  const auto dit =
      models::as_interface<models::Denoiser>(models::load_job_model(job, checkpoint), "model.family");
  dit->module().eval();
  std::shared_ptr<const data::Tokenizer> builtin;
  if (job.data.dataset == "moving_fashion")
    builtin = std::make_shared<data::WordTokenizer>(tasks::moving_fashion_tokenizer());
  const tasks::flow_matching::FlowHelpers helpers =
      tasks::flow_matching::load_flow_helpers(job, *dit, builtin);

  tasks::flow_matching::GenerationSettings settings;
  settings.frames = g.frames > 0 ? g.frames : job.data.frames;
  settings.height = settings.width = job.data.video_size;
  settings.guidance = g.guidance >= 0 ? g.guidance : job.training.sample_guidance;
  settings.sampling.steps = g.steps > 0 ? g.steps : job.training.sample_steps;
  settings.sampling.shift = g.shift > 0 ? g.shift : job.training.sample_shift;
  settings.sampling.solver =
      tasks::flow_matching::parse_solver(g.solver.empty() ? job.training.sample_solver : g.solver,
                                         g.solver.empty() ? "training.sample_solver" : "--solver");
  const at::Tensor clips = tasks::flow_matching::generate_videos(*dit, *helpers.vae, *helpers.captions,
                                                                 {g.prompt}, {g.seed}, settings);
  tasks::write_clip(clips[0], g.out_dir, "video", g.fps);
  fmt::print(
      "wrote {0}/video.gif, {0}/video.mp4 and {1} frames in {0}/video/ ({2} steps of {3}, guidance {4}, seed "
      "{5})\n",
      g.out_dir, settings.frames, settings.sampling.steps,
      tasks::flow_matching::solver_name(settings.sampling.solver), settings.guidance, g.seed);
  return 0;
}

}  // namespace loom::cli
