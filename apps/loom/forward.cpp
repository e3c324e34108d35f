// loom forward: one forward pass of a model directory on given ids and images, its logits and
// image embeddings written whole; under loom run the ranks split the model by tensor parallelism.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "commands.h"
#include "loom/config/config.h"
#include "loom/core/layout.h"
#include "loom/data/image/decode.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/dist/comm.h"
#include "loom/dist/launch_env.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/tasks/vlm_sft/prompts.h"
#include "loom/util/errors.h"

namespace loom::cli {

namespace {

namespace fs = std::filesystem;

void write_f32(const fs::path& path, const at::Tensor& t) {
  auto c = t.to(at::kFloat).contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
  if (!out) throw Error(fmt::format("{}: cannot write", path.string()));
}

// forward's parallel layout as a job's parallel section: under loom run (or another launcher) the
// ranks split the model by tensor parallelism, tp = the number of ranks, and nothing else.
config::JobConfig forward_layout(int64_t world_size, bool sequence_parallel) {
  config::JobConfig job;
  job.source =
      world_size == 1
          ? "forward"
          : fmt::format("forward: {} ranks (tensor parallelism, tp = the number of ranks)", world_size);
  job.parallel.tp = world_size;
  job.parallel.dp = 1;
  job.parallel.sequence_parallel = sequence_parallel;
  return job;
}

// The model is checked against the layout, and the layout formed, as loom train does for a job's;
// rank 0 writes the outputs, gathered whole.
int run_forward(const std::string& model_dir, const std::string& input_path, const std::string& out_dir,
                bool sequence_parallel) {
  auto config = models::model_config_from_dir(model_dir);
  const dist::LaunchEnv launch = dist::launch_env_from_process();
  if (launch.world_size == 1 && sequence_parallel)
    throw ConfigError("forward: --sequence-parallel needs several ranks (loom run -n N -- loom forward ...)");
  const config::JobConfig job = forward_layout(launch.world_size, sequence_parallel);
  models::validate_layout(job, config, launch.world_size);
  std::shared_ptr<dist::Comm> world;
  if (launch.world_size > 1)
    world = dist::Comm::connect(launch, std::chrono::seconds(job.parallel.timeout_s),
                                std::chrono::seconds(job.parallel.heartbeat_timeout_s));
  const core::Layout layout = core::make_layout(job, std::move(world));
  parallel::ParamOptions model_options;
  model_options.tp = {layout.tp, job.parallel.sequence_parallel};
  auto model = models::build_model(config, model_options);
  models::load_parameters(*model, model_dir);
  std::ifstream in(input_path);
  if (!in) throw DataError(fmt::format("{}: cannot open the input file", input_path));
  nlohmann::json input;
  try {
    input = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON ({})", input_path, e.what()));
  }
  if (!input.contains("input_ids") || !input["input_ids"].is_array() || input["input_ids"].empty())
    throw DataError(fmt::format("{}: input_ids must be a non-empty list of lists of token ids", input_path));
  const auto& rows = input["input_ids"];
  const size_t length = rows[0].size();
  std::vector<int64_t> flat;
  for (const auto& row : rows) {
    if (!row.is_array() || row.size() != length)
      throw DataError(fmt::format("{}: input_ids rows must be lists of equal length {}", input_path, length));
    for (const auto& v : row) flat.push_back(v.get<int64_t>());
  }
  models::VisionLanguageInputs inputs;
  inputs.input_ids = at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
  std::vector<at::Tensor> pixels;
  std::vector<int64_t> grids;
  const auto options = tasks::image_options_from_dir(model_dir, config);
  for (const auto& image : input.value("images", nlohmann::json::array())) {
    const fs::path path = fs::path(input_path).parent_path() / image.get<std::string>();
    auto processed = data::qwen2vl_process_image(data::decode_image_file(path.string()), options);
    pixels.push_back(processed.pixel_values);
    grids.insert(grids.end(), processed.grid_thw.begin(), processed.grid_thw.end());
  }
  at::Tensor image_embeds = at::empty({0, config.text.hidden_size});
  at::NoGradGuard no_grad;
  if (!pixels.empty()) {
    inputs.pixel_values = at::cat(pixels);
    inputs.image_grid_thw = at::tensor(grids, at::kLong).view({-1, 3});
    image_embeds = model->image_embeddings(inputs.pixel_values, inputs.image_grid_thw);
  }
  auto logits = model->whole_logits(model->hidden_states(inputs));
  if (!layout.is_main()) return 0;
  fs::create_directories(out_dir);
  write_f32(fs::path(out_dir) / "logits.bin", logits);
  write_f32(fs::path(out_dir) / "image_embeds.bin", image_embeds);
  nlohmann::json shapes = {{"logits", logits.sizes().vec()}, {"image_embeds", image_embeds.sizes().vec()}};
  if (inputs.pixel_values.defined()) shapes["pixel_values"] = inputs.pixel_values.sizes().vec();
  std::ofstream(fs::path(out_dir) / "shapes.json") << shapes.dump(2) << "\n";
  fmt::print("wrote {} (logits {}, image_embeds {})\n", out_dir, fmt::join(logits.sizes(), "x"),
             fmt::join(image_embeds.sizes(), "x"));
  return 0;
}

}  // namespace

Command add_forward(CLI::App& loom) {
  struct Arguments {
    std::string model_dir, input_path, out_dir;
    bool sequence_parallel = false;
  };
  auto arguments = std::make_shared<Arguments>();
  auto* command =
      loom.add_subcommand("forward", "One forward pass of a model directory on given ids and images");
  command->add_option("--model", arguments->model_dir, "Model directory (config.json + safetensors)")
      ->required();
  command
      ->add_option("--input", arguments->input_path, "JSON with input_ids (list of lists) and images (paths)")
      ->required();
  command
      ->add_option("--out", arguments->out_dir,
                   "Output directory for logits.bin, image_embeds.bin, shapes.json")
      ->required();
  command->add_flag("--sequence-parallel", arguments->sequence_parallel,
                    "Under loom run -n N (the ranks split the model, tp = N): split the sequence too");
  return {command, [arguments] {
            const auto& a = *arguments;
            return run_forward(a.model_dir, a.input_path, a.out_dir, a.sequence_parallel);
          }};
}

}  // namespace loom::cli
