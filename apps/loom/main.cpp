// The loom command line: train, eval, bench, run, forward, shapes, data tokenize.
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <malloc.h>
#include <sched.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <optional>

#include "loom/config/config.h"
#include "loom/data/chat_template.h"
#include "loom/data/image/decode.h"
#include "loom/data/image/qwen2vl_processor.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/dist/comm.h"
#include "loom/dist/launch_env.h"
#include "loom/dist/launcher.h"
#include "loom/models/registry.h"
#include "loom/models/weights.h"
#include "loom/tasks/registry.h"
#include "loom/tasks/vlm_sft/task.h"
#include "loom/train/trainer.h"
#include "loom/util/errors.h"
#include "loom/util/log.h"

namespace fs = std::filesystem;
using namespace loom;

namespace {

// OpenBLAS picks its kernels from the CPU model when it loads. On a CPU it does not recognise (the
// 2-core machine reports a generic "Intel(R) Xeon(R) Processor") it falls back to Prescott's SSE3
// kernels, although the CPU has AVX-512: sgemm ran at 63 GFLOP/s instead of 306 and a training
// step took 1.7x longer. The core type that matches the instruction set, or nothing to change.
std::string openblas_core_for_this_cpu() {
  using CoreName = char* (*)();
  const auto name = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!name || std::getenv("OPENBLAS_CORETYPE") != nullptr) return "";
  std::string core = name();
  std::transform(core.begin(), core.end(), core.begin(), [](unsigned char c) { return std::tolower(c); });
  if (core != "prescott") return "";
#if defined(__x86_64__)
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
      __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
#endif
  return "";
}

// Settings that only take effect when the runtimes load, before main: OpenMP threads that sleep when
// idle (OMP_WAIT_POLICY=PASSIVE; spinning OpenMP threads starve OpenBLAS's on small products) and
// OpenBLAS's kernels for this CPU. When one is missing, Loom sets it and starts itself again; a
// user's own setting is kept.
void ensure_startup_environment(char** argv) {
  bool restart = false;
  if (std::getenv("OMP_WAIT_POLICY") == nullptr) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    restart = true;
  }
  if (const std::string core = openblas_core_for_this_cpu(); !core.empty()) {
    setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
    restart = true;
  }
  if (restart) execv("/proc/self/exe", argv);  // returns only on failure; then run as we are
}

// A training step frees and reallocates the same tensors over and over. glibc's defaults give
// blocks over 128 KiB their own mmap and hand freed heap top back to the kernel, so every step pays
// page faults and zeroing for memory it just returned (half the CPU time was kernel time on the
// 2-core machine). Keeping freed memory in the process, as PyTorch's caching allocators do on
// GPUs, made a tiny Qwen2-VL step 20% faster there. A user's own MALLOC_* settings win.
void keep_freed_memory() {
#ifdef __GLIBC__
  for (const char* name : {"MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_"})
    if (std::getenv(name) != nullptr) return;
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's largest: blocks up to 32 MiB come from the heap
  mallopt(M_TRIM_THRESHOLD, 1 << 30);   // give the heap top back only beyond 1 GiB free
  mallopt(M_TOP_PAD, 256 << 20);        // and grow it in 256 MiB steps
#endif
}

// Keeps OpenBLAS's own thread pool at the thread count ATen uses.
void set_blas_threads(int threads) {
  using SetThreads = void (*)(int);
  if (auto fn = reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"))) fn(threads);
}

// training.threads, or for 0 this process's share of the cores it may run on (the processes
// `loom run` started on this node split them). OpenMP's own default is not used: on the 2-core
// machine libgomp offered 1 thread, so a default job left a core idle.
void use_threads(int64_t configured, int64_t local_processes) {
  int threads = static_cast<int>(configured);
  if (threads <= 0) {
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    const int available = sched_getaffinity(0, sizeof(cpus), &cpus) == 0
                              ? CPU_COUNT(&cpus)
                              : static_cast<int>(sysconf(_SC_NPROCESSORS_ONLN));
    threads = std::max(1, available / static_cast<int>(std::max<int64_t>(local_processes, 1)));
  }
  at::set_num_threads(threads);
  set_blas_threads(threads);
}

void write_f32(const fs::path& path, const at::Tensor& t) {
  auto c = t.to(at::kFloat).contiguous();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(c.data_ptr<float>()), c.numel() * sizeof(float));
  if (!out) throw Error(fmt::format("{}: cannot write", path.string()));
}

data::Qwen2VLImageOptions image_options_for(const std::string& model_dir,
                                            const models::Qwen2VLConfig& config) {
  data::Qwen2VLImageOptions options;
  options.patch_size = config.vision.patch_size;
  options.temporal_patch_size = config.vision.temporal_patch_size;
  options.merge_size = config.vision.spatial_merge_size;
  const fs::path pre = fs::path(model_dir) / "preprocessor_config.json";
  if (!fs::exists(pre)) return options;
  std::ifstream in(pre);
  auto j = nlohmann::json::parse(in);
  if (j.contains("min_pixels")) options.min_pixels = j["min_pixels"].get<int64_t>();
  if (j.contains("max_pixels")) options.max_pixels = j["max_pixels"].get<int64_t>();
  if (j.contains("image_mean"))
    for (int c = 0; c < 3; ++c) options.mean[c] = j["image_mean"][c].get<float>();
  if (j.contains("image_std"))
    for (int c = 0; c < 3; ++c) options.std[c] = j["image_std"][c].get<float>();
  return options;
}

// Under loom run (or another launcher) the ranks split the model by tensor parallelism, tp = the
// number of ranks, and rank 0 writes the outputs, gathered whole.
int run_forward(const std::string& model_dir, const std::string& input_path, const std::string& out_dir,
                bool sequence_parallel) {
  auto config = models::model_config_from_dir(model_dir);
  const dist::LaunchEnv launch = dist::launch_env_from_process();
  parallel::ParamOptions model_options;
  if (launch.world_size > 1) {
    for (const auto& [what, count] :
         {std::pair<const char*, int64_t>{"attention heads", config.text.num_heads},
          {"vision attention heads", config.vision.num_heads},
          {"vocabulary rows", config.text.vocab_size}})
      if (count % launch.world_size != 0)
        throw ConfigError(
            fmt::format("forward: {} ranks (tensor parallelism) do not divide the model's {} {}",
                        launch.world_size, count, what));
    const int64_t kv = config.text.num_kv_heads;
    if (kv % launch.world_size != 0 && launch.world_size % kv != 0)
      throw ConfigError(fmt::format(
          "forward: {} ranks (tensor parallelism) neither divide the model's {} kv heads nor are a multiple "
          "of them",
          launch.world_size, kv));
    model_options.tp = {dist::Comm::connect(launch, std::chrono::seconds(300)), sequence_parallel};
  } else if (sequence_parallel) {
    throw ConfigError("forward: --sequence-parallel needs several ranks (loom run -n N -- loom forward ...)");
  }
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
  const auto options = image_options_for(model_dir, config);
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
  if (launch.rank != 0) return 0;
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

int run_shapes(const std::string& what, bool list) {
  models::Qwen2VLConfig config;
  const auto published = models::published_config_names();
  if (std::find(published.begin(), published.end(), what) != published.end()) {
    auto hf = models::published_hf_config(what);
    config = models::model_config_from_json(hf["model_type"].get<std::string>(), hf, what);
  } else if (fs::is_directory(what)) {
    config = models::model_config_from_dir(what);
  } else {
    throw ConfigError(fmt::format("'{}' is neither a model directory nor a published model (valid: {})", what,
                                  fmt::join(published, ", ")));
  }
  parallel::ParamOptions options;
  options.shapes_only = true;
  auto model = models::build_model(config, options);
  if (list)
    for (const auto& [name, p] : models::named_parameters(*model))
      fmt::print("{}\t[{}]\n", name, fmt::join(p.sizes(), ", "));
  fmt::print("{}: {} parameters\n", what, models::parameter_count(*model));
  return 0;
}

// The text messages of a chat for Qwen2-VL's chat template, from JSON text: a list of messages or
// {"messages": [...]}; a role is "system", "user" or "assistant"; content is a string or a list of
// {"type": "text", "text": ...} parts. Images are refused: their <|image_pad|> count depends on the
// image's size.
std::vector<data::Message> chat_messages(const std::string& text) {
  constexpr const char* kSource = "standard input";
  nlohmann::json input;
  try {
    input = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: the messages are not valid JSON ({})", kSource, e.what()));
  }
  const nlohmann::json& messages =
      input.is_object() && input.contains("messages") ? input["messages"] : input;
  if (!messages.is_array() || messages.empty()) {
    throw DataError(
        fmt::format("{}: expected a non-empty list of messages [{{\"role\": ..., \"content\": ...}}, ...] or "
                    "{{\"messages\": [...]}}",
                    kSource));
  }
  const auto refuse_image = [&](size_t i, const char* what) {
    return DataError(fmt::format(
        "{}: message {} has {}, which needs the image to count its tokens; use the training data path",
        kSource, i, what));
  };
  std::vector<data::Message> out;
  for (size_t i = 0; i < messages.size(); ++i) {
    const nlohmann::json& message = messages[i];
    if (!message.is_object() || !message.contains("role") || !message["role"].is_string() ||
        !message.contains("content")) {
      throw DataError(fmt::format("{}: message {} needs a \"role\" string and a \"content\"", kSource, i));
    }
    data::Message parsed;
    const std::string role = message["role"].get<std::string>();
    if (role == "system") {
      parsed.role = data::Role::system;
    } else if (role == "user") {
      parsed.role = data::Role::user;
    } else if (role == "assistant") {
      parsed.role = data::Role::assistant;
    } else {
      throw DataError(fmt::format(
          "{}: message {} has role \"{}\"; valid roles are \"system\", \"user\" and \"assistant\"", kSource,
          i, role));
    }
    const nlohmann::json& parts = message["content"];
    if (parts.is_string()) {
      parsed.content = parts.get<std::string>();
    } else if (parts.is_array()) {
      for (const nlohmann::json& part : parts) {
        if (!part.is_object()) {
          throw DataError(fmt::format("{}: message {} has a content part that is not an object", kSource, i));
        }
        const nlohmann::json type = part.value("type", nlohmann::json());
        if (type == "image" || type == "video" || part.contains("image") || part.contains("image_url") ||
            part.contains("video")) {
          throw refuse_image(i, "an image or video part");
        }
        if (!part.contains("text") || !part["text"].is_string()) {
          throw DataError(
              fmt::format("{}: message {} has a content part without a \"text\" string", kSource, i));
        }
        parsed.content += part["text"].get<std::string>();
      }
    } else {
      throw DataError(
          fmt::format("{}: message {} content must be a string or a list of text parts", kSource, i));
    }
    if (data::count_image_placeholders(parsed.content) > 0) throw refuse_image(i, "an <image> placeholder");
    out.push_back(std::move(parsed));
  }
  return out;
}

// Text on standard input to ids, or with `chat` messages through Qwen2-VL's chat template (the one
// training uses), printed as one JSON array.
int run_tokenize(const std::string& tokenizer_path, bool chat, bool add_generation_prompt) {
  const auto tokenizer = data::load_tokenizer(tokenizer_path);
  std::optional<data::ChatTemplate> chat_template;
  if (chat) chat_template.emplace(*tokenizer);  // DataError when the tokenizer lacks the ChatML tokens
  const std::string text{std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>()};
  const std::vector<data::Message> messages = chat ? chat_messages(text) : std::vector<data::Message>{};
  std::vector<int64_t> ids;
  try {
    ids = chat ? chat_template->encode_chat(messages, add_generation_prompt) : tokenizer->encode(text);
  } catch (const DataError& e) {
    throw DataError(fmt::format("standard input: {}", e.what()));
  }
  fmt::print("{}\n", nlohmann::json(ids).dump());
  return 0;
}

}  // namespace

// loom bench's report: rates, step time, MFU, memory, and the time split as seconds and shares.
nlohmann::json bench_json(const train::BenchResult& r) {
  auto share = [&r](double seconds) { return r.total_s > 0 ? seconds / r.total_s : 0.0; };
  nlohmann::json split;
  for (const auto& [name, seconds] : {std::pair<const char*, double>{"data", r.data_s},
                                      {"forward", r.forward_s},
                                      {"backward", r.backward_s},
                                      {"optimizer", r.optimizer_s},
                                      {"communication", r.communication_s}})
    split[name] = {{"s", seconds}, {"share", share(seconds)}};
  return {{"steps", r.steps},
          {"warmup", r.warmup},
          {"data_parallel_ranks", r.ranks},
          {"tokens_per_s", r.tokens_per_s},
          {"samples_per_s", r.samples_per_s},
          {"step_time_median_s", r.step_time_median_s},
          {"mfu", r.mfu},
          {"sgemm_gflops", r.sgemm_gflops},
          {"peak_rss_mib", r.peak_rss_mib},
          {"time_s", r.total_s},
          {"time_split", split}};
}

int main(int argc, char** argv) {
  // A write to a socket whose peer died (a lost rank's store or Gloo connection) must be an error
  // Loom reports with the lost rank's name, not a SIGPIPE that ends this rank without a word: rank
  // 0, which serves the store, died so once while answering a killed rank.
  std::signal(SIGPIPE, SIG_IGN);
  ensure_startup_environment(argv);
  keep_freed_memory();
  CLI::App app{"Loom: trains multimodal models from one binary"};
  app.require_subcommand(1);
  std::string log_level = "info";
  app.add_option("--log-level", log_level, "trace, debug, info, warn or error");

  std::string config_path, checkpoint_dir, predictions_path, model_dir, input_path, out_dir, shapes_model;
  std::string tokenizer_path;
  std::vector<std::string> overrides;
  bool list_names = false, chat = false, add_generation_prompt = false, sequence_parallel = false;

  auto* train = app.add_subcommand("train", "Train a model from a job config (YAML)");
  train->add_option("config", config_path, "Job config file")->required();
  train->add_option("--set", overrides, "Override a config key: key=value (repeatable)");

  auto* eval = app.add_subcommand("eval", "Evaluate a checkpoint on the job's held-out data");
  eval->add_option("config", config_path, "Job config file")->required();
  eval->add_option("--checkpoint", checkpoint_dir, "Checkpoint directory")->required();
  eval->add_option("--set", overrides, "Override a config key: key=value (repeatable)");
  eval->add_option("--predictions", predictions_path,
                   "Write each question, its answer and the model's answer as JSON lines to this file");

  int64_t bench_steps = 20, bench_warmup = 3;
  auto* bench = app.add_subcommand(
      "bench", "Time a job's training steps after warm-up and print one JSON object (nothing is written)");
  bench->add_option("config", config_path, "Job config file")->required();
  bench->add_option("--set", overrides, "Override a config key: key=value (repeatable)");
  bench->add_option("--steps", bench_steps, "Timed steps (default 20)");
  bench->add_option("--warmup", bench_warmup, "Untimed steps first (default 3)");

  dist::LaunchOptions launch_options;
  std::vector<std::string> run_command;
  auto* run = app.add_subcommand(
      "run", "Start N processes of a data-parallel job on this node: loom run -n N -- loom train job.yaml");
  run->add_option("-n,--nproc-per-node", launch_options.nproc_per_node, "Processes on this node")->required();
  run->add_option("--nnodes", launch_options.nnodes, "Nodes in the job (default 1)");
  run->add_option("--node-rank", launch_options.node_rank, "This node's index, 0 to nnodes-1 (default 0)");
  run->add_option("--master-addr", launch_options.master_addr, "Address of node 0 (default 127.0.0.1)");
  run->add_option("--master-port", launch_options.master_port,
                  "Rendezvous port on node 0 (default: a free port for one node, 29500 for several)");
  run->add_option("command", run_command, "The command each process runs, after --")->required();

  auto* forward =
      app.add_subcommand("forward", "One forward pass of a model directory on given ids and images");
  forward->add_option("--model", model_dir, "Model directory (config.json + safetensors)")->required();
  forward->add_option("--input", input_path, "JSON with input_ids (list of lists) and images (paths)")
      ->required();
  forward->add_option("--out", out_dir, "Output directory for logits.bin, image_embeds.bin, shapes.json")
      ->required();
  forward->add_flag("--sequence-parallel", sequence_parallel,
                    "Under loom run -n N (the ranks split the model, tp = N): split the sequence too");

  auto* shapes =
      app.add_subcommand("shapes", "List a model's parameter names, shapes and count without allocating");
  shapes->add_option("model", shapes_model, "Published model name (e.g. qwen2-vl-7b) or model directory")
      ->required();
  shapes->add_flag("--names", list_names, "Print every parameter name and shape");

  auto* data_command = app.add_subcommand("data", "Data tools: tokenize, export");
  data_command->require_subcommand(1);
  auto* tokenize = data_command->add_subcommand(
      "tokenize", "Print the token ids of UTF-8 text on standard input as one JSON array");
  tokenize
      ->add_option("--tokenizer", tokenizer_path, "tokenizer.json (BPE or WordLevel) or SentencePiece .model")
      ->required();
  tokenize->add_flag("--chat", chat,
                     "Read messages JSON ([{\"role\": ..., \"content\": ...}] or {\"messages\": [...]}) and "
                     "apply Qwen2-VL's ChatML template");
  tokenize
      ->add_flag("--add-generation-prompt", add_generation_prompt,
                 "With --chat, end with the opening of the assistant's turn")
      ->needs("--chat");

  int64_t export_steps = 5;
  auto* export_command = data_command->add_subcommand(
      "export",
      "Write a job's initial weights, settings and first steps' micro-batches (with position ids) for a peer "
      "implementation to train on: loom data export job.yaml --out DIR");
  export_command->add_option("config", config_path, "Job config file")->required();
  export_command->add_option("--set", overrides, "Override a config key: key=value (repeatable)");
  export_command->add_option("--steps", export_steps, "Steps to write (default 5)");
  export_command->add_option("--out", out_dir, "Output directory")->required();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    configure_logging(log_level);
    set_blas_threads(at::get_num_threads());
    if (*run) return dist::launch(launch_options, run_command);
    if (*export_command) {
      auto job = config::load_config(config_path, overrides);
      configure_logging(job.tools.log_level);
      use_threads(job.training.threads, 1);
      tasks::export_steps(job, out_dir, export_steps);
      return 0;
    }
    if (*train || *eval || *bench) {
      auto job = config::load_config(config_path, overrides);
      configure_logging(job.tools.log_level);
      // Started by loom run, torchrun, Slurm or Open MPI: join the other ranks, after checking
      // that the job's parallel layout fits their number.
      const dist::LaunchEnv launch = dist::launch_env_from_process();
      use_threads(job.training.threads, launch.local_world_size);
      std::shared_ptr<dist::Comm> comm;
      if (launch.world_size > 1) {
        tasks::validate_layout(job, launch.world_size);
        comm = dist::Comm::connect(launch, std::chrono::seconds(job.parallel.timeout_s));
        if (launch.rank != 0) configure_logging("warn");  // rank 0 reports; the others only warn
      }
      const bool main_rank = launch.rank == 0;
      train::Trainer trainer(job, comm);
      if (*train) {
        if (auto result = trainer.train(); result && main_rank) fmt::print("{}", result->report);
      } else if (*bench) {
        const train::BenchResult r = trainer.bench(bench_warmup, bench_steps);
        if (main_rank) fmt::print("{}\n", bench_json(r).dump());
      } else {
        trainer.load_weights(checkpoint_dir);
        const auto result = trainer.evaluate();
        if (main_rank) {
          fmt::print("{}", result.report);
          if (!predictions_path.empty()) train::write_records(result, predictions_path);
        }
      }
      return 0;
    }
    if (*forward) return run_forward(model_dir, input_path, out_dir, sequence_parallel);
    if (*shapes) return run_shapes(shapes_model, list_names);
    if (*tokenize) return run_tokenize(tokenizer_path, chat, add_generation_prompt);
  } catch (const std::exception& e) {
    std::string message = e.what();
    // libtorch errors carry a backtrace after the first line; the reason is the first line.
    message = message.substr(0, message.find('\n'));
    fmt::print(stderr, "loom: error: {}\n", message);
    return 1;
  }
  return 0;
}
