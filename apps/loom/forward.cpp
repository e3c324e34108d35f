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
#include "loom/dist/comm.h"
#include "loom/dist/launch_env.h"
#include "loom/models/generator.h"
#include "loom/models/registry.h"
#include "loom/models/vision_language.h"
#include "loom/models/weights.h"
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

nlohmann::json read_input(const std::string& input_path) {
  std::ifstream in(input_path);
  if (!in) throw DataError(fmt::format("{}: cannot open the input file", input_path));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON ({})", input_path, e.what()));
  }
}

// `key` of the input: a non-empty list of equally long lists of integers, as a (rows, length) tensor.
at::Tensor integer_rows(const nlohmann::json& input, const char* key, const std::string& input_path) {
  const auto bad = [&] {
    return DataError(
        fmt::format("{}: {} must be a non-empty list of equally long lists of integers", input_path, key));
  };
  if (!input.contains(key) || !input[key].is_array() || input[key].empty()) throw bad();
  const auto& rows = input[key];
  std::vector<int64_t> flat;
  for (const auto& row : rows) {
    if (!row.is_array() || row.size() != rows[0].size()) throw bad();
    for (const auto& v : row) {
      if (!v.is_number_integer()) throw bad();
      flat.push_back(v.get<int64_t>());
    }
  }
  return at::tensor(flat, at::kLong).view({static_cast<int64_t>(rows.size()), -1});
}

// An input of a reference run's io.json: `name` under its "files", read as float32 of the shape it
// records, from the io.json's directory.
at::Tensor io_tensor(const nlohmann::json& io, const std::string& io_path, const std::string& name) {
  const auto& files = io.contains("files") ? io["files"] : nlohmann::json::object();
  if (!files.is_object() || !files.contains(name) || !files[name].contains("shape"))
    throw DataError(fmt::format("{}: files.\"{}\" with its shape is missing", io_path, name));
  std::vector<int64_t> shape;
  for (const auto& d : files[name]["shape"]) {
    if (!d.is_number_integer() || d.get<int64_t>() < 0)
      throw DataError(fmt::format("{}: files.\"{}\".shape must be a list of sizes", io_path, name));
    shape.push_back(d.get<int64_t>());
  }
  const fs::path path = fs::path(io_path).parent_path() / name;
  at::Tensor t = at::empty(shape, at::kFloat);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(t.data_ptr<float>()),
          static_cast<std::streamsize>(t.numel() * sizeof(float)));
  if (!in || in.peek() != std::char_traits<char>::eof())
    throw DataError(fmt::format("{}: not {} float32 values (the shape io.json gives it: [{}])", path.string(),
                                t.numel(), fmt::join(shape, ", ")));
  return t;
}

void write_outputs(const std::string& out_dir,
                   const std::vector<std::pair<std::string, at::Tensor>>& outputs) {
  fs::create_directories(out_dir);
  nlohmann::json shapes;
  std::vector<std::string> written;
  for (const auto& [name, tensor] : outputs) {
    write_f32(fs::path(out_dir) / name, tensor);
    shapes[name] = tensor.sizes().vec();
    written.push_back(fmt::format("{} {}", name, fmt::join(tensor.sizes(), "x")));
  }
  std::ofstream(fs::path(out_dir) / "shapes.json") << shapes.dump(2) << "\n";
  fmt::print("wrote {} ({})\n", out_dir, fmt::join(written, ", "));
}

void refuse_ranks(const char* what) {
  if (dist::launch_env_from_process().world_size > 1)
    throw ConfigError(fmt::format("forward: the {} runs in one process (no tensor-parallel split)", what));
}

// The model of a directory, whole, as its kind's interface.
template <typename Interface>
std::shared_ptr<Interface> load_whole(const models::NamedModel& named, const std::string& model_dir) {
  refuse_ranks(models::kind_name(named.family->kind));
  return models::as_interface<Interface>(models::load_model(named, model_dir), named.source);
}

// A text encoder on input_ids and attention_mask (HF's input format): last_hidden_state.bin.
int forward_text_encoder(const models::NamedModel& named, const std::string& model_dir,
                         const std::string& input_path, const std::string& out_dir) {
  const auto model = load_whole<models::TextEncoder>(named, model_dir);
  const nlohmann::json input = read_input(input_path);
  const at::Tensor ids = integer_rows(input, "input_ids", input_path);
  const at::Tensor mask = input.contains("attention_mask") ? integer_rows(input, "attention_mask", input_path)
                                                           : at::ones_like(ids);
  if (mask.sizes() != ids.sizes())
    throw DataError(fmt::format("{}: attention_mask is {}, input_ids {}", input_path,
                                fmt::join(mask.sizes(), "x"), fmt::join(ids.sizes(), "x")));
  at::NoGradGuard no_grad;
  write_outputs(out_dir, {{"last_hidden_state.bin", model->encode(ids, mask)}});
  return 0;
}

// A denoiser on a reference run's inputs (io.json: x.bin [C_in, T, H, W], t.bin [1], context.bin
// [L_text, text_dim], one sample as upstream's model takes it): out.bin [C_out, T, H, W].
int forward_denoiser(const models::NamedModel& named, const std::string& model_dir,
                     const std::string& io_path, const std::string& out_dir) {
  const auto model = load_whole<models::Denoiser>(named, model_dir);
  const nlohmann::json io = read_input(io_path);
  const at::Tensor x = io_tensor(io, io_path, "x.bin"), t = io_tensor(io, io_path, "t.bin"),
                   context = io_tensor(io, io_path, "context.bin");
  at::NoGradGuard no_grad;
  const at::Tensor out = model->forward(x.unsqueeze(0), t.reshape({1}), context.unsqueeze(0))[0];
  write_outputs(out_dir, {{"out.bin", out}});
  return 0;
}

// A latent codec on each case of a reference run (io.json's "cases", each with <case>_video.bin
// [1, 3, T, H, W] in [-1, 1]): <case>_mu.bin and <case>_log_var.bin (raw, as encode gives them) and
// <case>_decoded_raw.bin (mu decoded, unclamped), chunk by chunk as upstream runs them.
int forward_latent_codec(const models::NamedModel& named, const std::string& model_dir,
                         const std::string& io_path, const std::string& out_dir) {
  const auto model = load_whole<models::LatentCodec>(named, model_dir);
  const nlohmann::json io = read_input(io_path);
  if (!io.contains("cases") || !io["cases"].is_object() || io["cases"].empty())
    throw DataError(fmt::format("{}: \"cases\" must name the videos to encode (<case>_video.bin)", io_path));
  std::vector<std::pair<std::string, at::Tensor>> outputs;
  at::NoGradGuard no_grad;
  for (const auto& [name, ignored] : io["cases"].items()) {
    const models::VaeEncoding encoding =
        model->encode_clips(io_tensor(io, io_path, name + "_video.bin"), /*chunked=*/true);
    outputs.emplace_back(name + "_mu.bin", encoding.mu);
    outputs.emplace_back(name + "_log_var.bin", encoding.log_var);
    outputs.emplace_back(name + "_decoded_raw.bin", model->decode_latents(encoding.mu, /*chunked=*/true));
  }
  write_outputs(out_dir, outputs);
  return 0;
}

// The model is checked against the layout, and the layout formed, as loom train does for a job's;
// rank 0 writes the outputs, gathered whole.
int forward_vision_language(const models::NamedModel& named, const std::string& model_dir,
                            const std::string& input_path, const std::string& out_dir,
                            bool sequence_parallel) {
  const dist::LaunchEnv launch = dist::launch_env_from_process();
  if (launch.world_size == 1 && sequence_parallel)
    throw ConfigError("forward: --sequence-parallel needs several ranks (loom run -n N -- loom forward ...)");
  const config::JobConfig job = forward_layout(launch.world_size, sequence_parallel);
  named.family->check_layout(job, named.hf, named.source, launch.world_size);
  std::shared_ptr<dist::Comm> world;
  if (launch.world_size > 1)
    world = dist::Comm::connect(launch, std::chrono::seconds(job.parallel.timeout_s),
                                std::chrono::seconds(job.parallel.heartbeat_timeout_s));
  const core::Layout layout = core::make_layout(job, std::move(world));
  models::BuildOptions options;
  options.params.tp = {layout.tp(), job.parallel.sequence_parallel};
  const auto model =
      std::dynamic_pointer_cast<models::VisionLanguageModel>(models::load_model(named, model_dir, options));
  const auto processor = models::make_processor(named.family->name, named.hf, named.source, model_dir);
  const nlohmann::json input = read_input(input_path);
  models::VisionLanguageInputs inputs;
  inputs.input_ids = integer_rows(input, "input_ids", input_path);
  std::vector<at::Tensor> pixels;
  std::vector<int64_t> grids;
  for (const auto& image : input.value("images", nlohmann::json::array())) {
    const fs::path path = fs::path(input_path).parent_path() / image.get<std::string>();
    const data::VisionInput processed = processor->process(data::decode_image_file(path.string()));
    pixels.push_back(processed.pixel_values);
    grids.insert(grids.end(), processed.grid_thw.begin(), processed.grid_thw.end());
  }
  // Videos: each a list of its frames' image files, taken video_fps a second.
  const double fps = input.value("video_fps", 2.0);
  std::vector<at::Tensor> video_pixels;
  std::vector<int64_t> video_grids;
  for (const auto& video : input.value("videos", nlohmann::json::array())) {
    if (!video.is_array() || video.empty())
      throw DataError(fmt::format(
          "{}: each of \"videos\" must be a non-empty list of its frames' image files", input_path));
    std::vector<data::Image> frames;
    for (const auto& frame : video)
      frames.push_back(
          data::decode_image_file((fs::path(input_path).parent_path() / frame.get<std::string>()).string()));
    const data::VisionInput processed = processor->process_video(frames, fps);
    video_pixels.push_back(processed.pixel_values);
    video_grids.insert(video_grids.end(), processed.grid_thw.begin(), processed.grid_thw.end());
    inputs.second_per_grid_ts.push_back(processed.second_per_grid);
  }
  at::Tensor image_embeds = at::empty({0, model->hidden_size()}), video_embeds;
  at::NoGradGuard no_grad;
  if (!pixels.empty()) {
    inputs.pixel_values = at::cat(pixels);
    inputs.image_grid_thw = at::tensor(grids, at::kLong).view({-1, 3});
    image_embeds = model->image_embeddings(inputs.pixel_values, inputs.image_grid_thw);
  }
  if (!video_pixels.empty()) {
    inputs.pixel_values_videos = at::cat(video_pixels);
    inputs.video_grid_thw = at::tensor(video_grids, at::kLong).view({-1, 3});
    video_embeds = model->image_embeddings(inputs.pixel_values_videos, inputs.video_grid_thw);
  }
  auto logits = model->whole_logits(model->hidden_states(inputs));
  const at::Tensor positions = model->position_ids(inputs);
  if (!layout.is_main()) return 0;
  fs::create_directories(out_dir);
  write_f32(fs::path(out_dir) / "logits.bin", logits);
  write_f32(fs::path(out_dir) / "image_embeds.bin", image_embeds);
  nlohmann::json shapes = {{"logits", logits.sizes().vec()}, {"image_embeds", image_embeds.sizes().vec()}};
  if (inputs.pixel_values.defined()) shapes["pixel_values"] = inputs.pixel_values.sizes().vec();
  if (video_embeds.defined()) {
    write_f32(fs::path(out_dir) / "video_embeds.bin", video_embeds);
    write_f32(fs::path(out_dir) / "pixel_values_videos.bin", inputs.pixel_values_videos);
    shapes["video_embeds"] = video_embeds.sizes().vec();
    shapes["pixel_values_videos"] = inputs.pixel_values_videos.sizes().vec();
  }
  std::ofstream(fs::path(out_dir) / "shapes.json") << shapes.dump(2) << "\n";
  // The positions the language model gave the tokens, and the grids they follow from.
  auto rows = [](const at::Tensor& t) {
    const at::Tensor c = t.to(at::kLong).contiguous();
    return nlohmann::json(std::vector<int64_t>(c.data_ptr<int64_t>(), c.data_ptr<int64_t>() + c.numel()));
  };
  nlohmann::json layout_json = {
      {"position_ids_shape", positions.sizes().vec()},
      {"position_ids", rows(positions)},
      {"image_grid_thw",
       inputs.image_grid_thw.defined() ? rows(inputs.image_grid_thw) : nlohmann::json::array()},
      {"video_grid_thw",
       inputs.video_grid_thw.defined() ? rows(inputs.video_grid_thw) : nlohmann::json::array()},
      {"second_per_grid_ts", inputs.second_per_grid_ts}};
  std::ofstream(fs::path(out_dir) / "positions.json") << layout_json.dump() << "\n";
  fmt::print("wrote {} (logits {}, image_embeds {})\n", out_dir, fmt::join(logits.sizes(), "x"),
             fmt::join(image_embeds.sizes(), "x"));
  return 0;
}

// The directory's family decides what the input holds and what is written.
int run_forward(const std::string& model_dir, const std::string& input_path, const std::string& out_dir,
                bool sequence_parallel) {
  const models::NamedModel named = models::find_model(model_dir);
  const models::ModelKind kind = named.family->kind;
  if (kind == models::ModelKind::vision_language)
    return forward_vision_language(named, model_dir, input_path, out_dir, sequence_parallel);
  if (sequence_parallel) throw ConfigError("forward: --sequence-parallel is for vision-language models");
  switch (kind) {
    case models::ModelKind::text_encoder:
      return forward_text_encoder(named, model_dir, input_path, out_dir);
    case models::ModelKind::denoiser:
      return forward_denoiser(named, model_dir, input_path, out_dir);
    case models::ModelKind::latent_codec:
      return forward_latent_codec(named, model_dir, input_path, out_dir);
    case models::ModelKind::vision_language:
      break;
  }
  throw ConfigError(
      fmt::format("forward: {} models ({}) have no forward command", named.family->name, named.source));
}

}  // namespace

Command add_forward(CLI::App& loom) {
  struct Arguments {
    std::string model_dir, input_path, out_dir;
    bool sequence_parallel = false;
  };
  auto arguments = std::make_shared<Arguments>();
  auto* command = loom.add_subcommand(
      "forward",
      "One forward pass of a model directory on given inputs, by the model's kind: ids, images and videos (a "
      "vision-language model: logits.bin, image_embeds.bin, video_embeds.bin, positions.json), ids and an "
      "attention mask (a text encoder: "
      "last_hidden_state.bin), or a reference run's io.json (a denoiser: out.bin; a latent codec: "
      "<case>_mu.bin, <case>_log_var.bin, <case>_decoded_raw.bin)");
  command->add_option("--model", arguments->model_dir, "Model directory (config.json + safetensors)")
      ->required();
  command
      ->add_option(
          "--input", arguments->input_path,
          "JSON with input_ids (list of lists), images (paths) and videos (each a list of its frames' "
          "paths, taken video_fps a second, default 2), or attention_mask (list of lists)")
      ->required();
  command
      ->add_option("--out", arguments->out_dir,
                   "Output directory for the outputs' .bin files (float32) and shapes.json")
      ->required();
  command->add_flag("--sequence-parallel", arguments->sequence_parallel,
                    "Under loom run -n N (the ranks split the model, tp = N): split the sequence too");
  return {command, [arguments] {
            const auto& a = *arguments;
            return run_forward(a.model_dir, a.input_path, a.out_dir, a.sequence_parallel);
          }};
}

}  // namespace loom::cli
