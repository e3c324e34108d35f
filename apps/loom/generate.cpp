// loom chat and loom generate: answers from a model directory (a checkpoint, a run directory's newest
// checkpoint, or an exported HF directory), decoded with the key/value cache (tasks/vlm_sft/generate.h)
// the task's evaluation uses; chat prints each answer as it is generated, generate answers a JSONL
// file of prompts in batches.
#include "loom/tasks/vlm_sft/generate.h"

#include <fmt/format.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.h"
#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/dist/launch_env.h"
#include "loom/models/registry.h"
#include "loom/models/vision_language.h"
#include "loom/tasks/vlm_sft/job_data.h"
#include "loom/tasks/vlm_sft/prompts.h"
#include "loom/util/errors.h"

namespace loom::cli {

namespace {

namespace fs = std::filesystem;

// A model directory loaded for answering, in this one process.
struct ChatModel {
  std::string dir;
  std::shared_ptr<models::VisionLanguageModel> model;
  std::unique_ptr<tasks::ChatPrompts> prompts;
  tasks::GenerationTokens tokens;
};

ChatModel load_chat_model(const std::string& path, const char* command) {
  if (dist::launch_env_from_process().world_size > 1)
    throw ConfigError(fmt::format("{} runs in one process, not under loom run", command));
  ChatModel out;
  out.dir = checkpoint::resolve_model_directory(path);
  const models::NamedModel named = models::find_model(out.dir);
  if (named.family->kind != models::ModelKind::vision_language)
    throw ConfigError(fmt::format("{}: {} holds a {} model ({}), not a vision-language model", command,
                                  out.dir, named.family->name, models::kind_name(named.family->kind)));
  out.model = std::dynamic_pointer_cast<models::VisionLanguageModel>(models::load_model(named, out.dir));
  out.model->module().eval();
  out.prompts = std::make_unique<tasks::ChatPrompts>(
      out.dir, models::make_processor(named.family->name, named.hf, named.source, out.dir));
  out.tokens = tasks::generation_tokens(out.prompts->tokenizer());
  return out;
}

void add_sampling_options(CLI::App* command, tasks::SamplingOptions& options) {
  command->add_option("--max-new-tokens", options.max_new_tokens, "Longest answer, in tokens (default 256)");
  command->add_option("--temperature", options.temperature, "0 (default): greedy; > 0: sampled");
  command->add_option("--top-k", options.top_k, "Sample from the k most likely tokens (0, default: all)");
  command->add_option("--top-p", options.top_p,
                      "Sample from the fewest most likely tokens whose probabilities reach p (default 1)");
  command->add_option("--seed", options.seed, "Seed of the sampling draws (default 0)");
}

// Prints a row's answer as its tokens come: the text decoded so far, less what is already printed,
// held back while it ends inside a multi-byte character (finish() prints whatever is left).
class StreamPrinter {
 public:
  explicit StreamPrinter(const data::Tokenizer& tokenizer) : tokenizer_(tokenizer) {}
  void add(int64_t token) {
    tokens_.push_back(token);
    const std::string text = tokenizer_.decode(tokens_);
    static const std::string kReplacement = "\xEF\xBF\xBD";
    if (text.size() >= kReplacement.size() &&
        text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0)
      return;
    print(text);
  }
  // Prints the rest of the answer; returns it whole.
  std::string finish() {
    const std::string text = tokenizer_.decode(tokens_);
    print(text);
    return text;
  }

 private:
  void print(const std::string& text) {
    if (text.size() <= printed_) return;
    std::fwrite(text.data() + printed_, 1, text.size() - printed_, stdout);
    std::fflush(stdout);
    printed_ = text.size();
  }

  const data::Tokenizer& tokenizer_;
  std::vector<int64_t> tokens_;
  size_t printed_ = 0;
};

// One answer to `messages`, printed as it is generated; returns its text.
std::string answer(const ChatModel& chat, const std::vector<data::Message>& messages,
                   const std::vector<std::string>& images, const tasks::SamplingOptions& options) {
  const data::Batch batch = data::collate({chat.prompts->prompt(messages, images, "chat")}, chat.tokens.pad);
  StreamPrinter printer(chat.prompts->tokenizer());
  const tasks::Generated out = tasks::generate(*chat.model, batch, chat.tokens, options,
                                               [&](int64_t, int64_t token) { printer.add(token); });
  const std::string text = printer.finish();
  std::fputs(out.finished[0] ? "\n" : " ...\n", stdout);
  std::fflush(stdout);
  return text;
}

int run_chat(const std::string& model_dir, const std::vector<std::string>& images, const std::string& prompt,
             const std::string& system, const tasks::SamplingOptions& options) {
  tasks::check_sampling(options);
  const ChatModel chat = load_chat_model(model_dir, "chat");
  std::vector<data::Message> messages;
  if (!system.empty()) {
    if (chat.prompts->format() == tasks::PromptFormat::vqa)
      throw ConfigError(
          "chat: --system: this model's prompt format (the built-in VQA sets') has no system message");
    messages.push_back({data::Role::system, system});
  }
  if (!prompt.empty()) {
    messages.push_back({data::Role::user, prompt});
    answer(chat, messages, images, options);
    return 0;
  }
  // Interactive: each line is a user turn; ChatML models keep the conversation (the images belong to
  // its first turn), the VQA format answers each question about the images alone.
  const bool interactive = isatty(STDIN_FILENO) != 0;
  if (interactive)
    std::fprintf(stderr, "loom chat: %s (%s); an empty line or end of input ends the chat\n",
                 chat.dir.c_str(),
                 chat.prompts->format() == tasks::PromptFormat::vqa ? "one question per line" : "ChatML");
  std::string line;
  while (true) {
    if (interactive) std::fputs("> ", stderr);
    if (!std::getline(std::cin, line) || line.empty()) break;
    if (chat.prompts->format() == tasks::PromptFormat::vqa) {
      answer(chat, {{data::Role::user, line}}, images, options);
      continue;
    }
    const bool first = messages.size() == (system.empty() ? 0u : 1u);
    if (!first && data::count_image_placeholders(line) > 0) {
      std::fprintf(stderr, "loom chat: the images belong to the first turn; write later turns without %s\n",
                   data::kImagePlaceholder);
      continue;
    }
    messages.push_back({data::Role::user, line});
    // The images go before the first user turn's text unless it places them (ChatPrompts::prompt).
    messages.push_back({data::Role::assistant, answer(chat, messages, images, options)});
  }
  return 0;
}

// One prompt of a generate input file: {"prompt": TEXT} or {"messages": [{"role", "content"}...]}, with
// "images": [paths, relative to the file's directory].
struct PromptRow {
  std::vector<data::Message> messages;
  std::vector<std::string> images;
};

PromptRow parse_prompt(const nlohmann::json& row, const fs::path& root, const std::string& where) {
  PromptRow out;
  if (!row.is_object()) throw DataError(fmt::format("{}: not a JSON object", where));
  if (row.contains("prompt")) {
    if (!row["prompt"].is_string()) throw DataError(fmt::format("{}: \"prompt\" is not a string", where));
    out.messages.push_back({data::Role::user, row["prompt"].get<std::string>()});
  } else if (row.contains("messages") && row["messages"].is_array()) {
    for (const auto& m : row["messages"]) {
      if (!m.is_object() || !m.contains("role") || !m["role"].is_string() || !m.contains("content") ||
          !m["content"].is_string())
        throw DataError(fmt::format("{}: each message needs string \"role\" and \"content\"", where));
      const std::string role = m["role"].get<std::string>();
      const data::Role r =
          role == "user"        ? data::Role::user
          : role == "assistant" ? data::Role::assistant
          : role == "system"
              ? data::Role::system
              : throw DataError(fmt::format("{}: role '{}' is not user, assistant or system", where, role));
      out.messages.push_back({r, m["content"].get<std::string>()});
    }
  } else {
    throw DataError(fmt::format("{}: needs \"prompt\" (a string) or \"messages\" (a list)", where));
  }
  for (const auto& image : row.value("images", nlohmann::json::array())) {
    if (!image.is_string()) throw DataError(fmt::format("{}: \"images\" must be a list of paths", where));
    const fs::path path = image.get<std::string>();
    out.images.push_back((path.is_absolute() ? path : root / path).string());
  }
  return out;
}

int run_generate(const std::string& model_dir, const std::string& input, const std::string& output,
                 int64_t batch_size, const tasks::SamplingOptions& options) {
  tasks::check_sampling(options);
  if (batch_size < 1) throw ConfigError(fmt::format("generate: --batch-size {} is not >= 1", batch_size));
  std::ifstream in(input);
  if (!in) throw DataError(fmt::format("{}: cannot open the prompts file", input));
  const ChatModel chat = load_chat_model(model_dir, "generate");
  std::vector<data::TokenizedExample> prompts;
  std::string line;
  for (int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = fmt::format("{} line {}", input, number);
    nlohmann::json row;
    try {
      row = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      throw DataError(fmt::format("{}: not valid JSON ({})", where, e.what()));
    }
    const PromptRow parsed = parse_prompt(row, fs::path(input).parent_path(), where);
    prompts.push_back(chat.prompts->prompt(parsed.messages, parsed.images, where));
  }
  if (prompts.empty()) throw DataError(fmt::format("{}: no prompts", input));
  std::ofstream out(output);
  if (!out) throw DataError(fmt::format("{}: cannot be written", output));
  const data::Tokenizer& tokenizer = chat.prompts->tokenizer();
  for (size_t begin = 0; begin < prompts.size(); begin += static_cast<size_t>(batch_size)) {
    const size_t end = std::min(prompts.size(), begin + static_cast<size_t>(batch_size));
    const std::vector<data::TokenizedExample> rows(prompts.begin() + begin, prompts.begin() + end);
    tasks::SamplingOptions batch_options = options;
    batch_options.first_row = begin;  // each prompt's draws follow from its index in the file
    const tasks::Generated answers =
        tasks::generate(*chat.model, data::collate(rows, chat.tokens.pad), chat.tokens, batch_options);
    for (size_t r = 0; r < rows.size(); ++r)
      out << nlohmann::json{{"index", begin + r},
                            {"prompt", rows[r].question},
                            {"answer", tokenizer.decode(answers.tokens[r])},
                            {"finished", static_cast<bool>(answers.finished[r])},
                            {"new_tokens", answers.tokens[r].size()}}
                 .dump()
          << "\n";
    fmt::print("generate: {} of {} prompts answered\n", end, prompts.size());
  }
  out.close();
  if (!out) throw DataError(fmt::format("{}: writing failed", output));
  fmt::print("wrote {} answers to {}\n", prompts.size(), output);
  return 0;
}

}  // namespace

Command add_chat(CLI::App& loom) {
  struct Arguments {
    std::string model, prompt, system;
    std::vector<std::string> images;
    tasks::SamplingOptions sampling;
  };
  auto arguments = std::make_shared<Arguments>();
  arguments->sampling.max_new_tokens = 256;
  auto* command = loom.add_subcommand(
      "chat",
      "Talk to a model: loom chat MODEL [--image PATH]... [--prompt TEXT] (else one turn per line of input)");
  command
      ->add_option("model", arguments->model,
                   "Checkpoint or model directory, or a run directory (its newest checkpoint)")
      ->required();
  command->add_option("--image", arguments->images, "An image file (repeatable), shown in the first turn");
  command->add_option("--prompt", arguments->prompt, "Answer this one message and exit");
  command->add_option("--system", arguments->system, "The system message (ChatML models)");
  add_sampling_options(command, arguments->sampling);
  return {command, [arguments] {
            const auto& a = *arguments;
            return run_chat(a.model, a.images, a.prompt, a.system, a.sampling);
          }};
}

Command add_generate(CLI::App& loom) {
  struct Arguments {
    std::string model, input, output;
    int64_t batch_size = 8;
    tasks::SamplingOptions sampling;
    VideoGeneration video;
  };
  auto arguments = std::make_shared<Arguments>();
  arguments->sampling.max_new_tokens = 256;
  auto* command = loom.add_subcommand(
      "generate",
      "Answer a JSONL file of prompts (loom generate MODEL --prompts FILE --out FILE), or make a clip for a "
      "caption with a flow_matching job's checkpoint (loom generate JOB.yaml --checkpoint DIR --prompt TEXT "
      "--out DIR)");
  command
      ->add_option("model", arguments->model,
                   "A model or checkpoint directory, or a run directory (its newest checkpoint); or the "
                   "config file of a flow_matching job")
      ->required();
  auto* prompts =
      command->add_option("--prompts", arguments->input,
                          "JSONL: {\"prompt\": TEXT} or {\"messages\": [...]}, with \"images\": [paths]");
  command
      ->add_option("--out", arguments->output,
                   "JSONL of the answers, in the prompts' order; for a clip, the directory of video.gif, "
                   "video.mp4 and video/frame-NNNN.png")
      ->required();
  command->add_option("--batch-size", arguments->batch_size, "Prompts decoded together (default 8)");
  add_sampling_options(command, arguments->sampling);
  auto& v = arguments->video;
  std::vector<CLI::Option*> video_only = {
      command->add_option("--checkpoint", v.checkpoint, "Clips: the DiT's checkpoint or run directory"),
      command->add_option("--prompt", v.prompt, "Clips: the caption"),
      command->add_option("--frames", v.frames, "Clips: frames, 1 + 4k (default: the job's data.frames)"),
      command->add_option("--steps", v.steps, "Clips: solver steps (default: training.sample_steps)"),
      command->add_option("--guidance", v.guidance,
                          "Clips: classifier-free guidance (default: sample_guidance)"),
      command->add_option("--solver", v.solver, "Clips: euler, dpm++ or unipc (default: sample_solver)"),
      command->add_option("--shift", v.shift, "Clips: the schedule's shift (default: sample_shift)"),
      command->add_option("--fps", v.fps, "Clips: frames per second of the GIF and MP4 (default 8)"),
      command->add_option("--set", v.overrides, kOverrideHelp)};
  return {command, [arguments, prompts, video_only, command] {
            const auto& a = *arguments;
            const bool job_file = fs::is_regular_file(a.model);
            if (!job_file) {
              for (const CLI::Option* option : video_only)
                if (option->count() > 0)
                  throw ConfigError(
                      fmt::format("generate: {} is for clips from a job file; '{}' is a model "
                                  "directory",
                                  option->get_name(), a.model));
              if (prompts->count() == 0)
                throw ConfigError("generate: --prompts is required to answer with a model directory");
              return run_generate(a.model, a.input, a.output, a.batch_size, a.sampling);
            }
            for (const char* answers_only :
                 {"--prompts", "--batch-size", "--max-new-tokens", "--temperature", "--top-k", "--top-p"})
              if (command->get_option(answers_only)->count() > 0)
                throw ConfigError(
                    fmt::format("generate: {} is for answers from a model directory; '{}' is a job "
                                "file (clips take --prompt, --checkpoint, --frames, --steps, "
                                "--guidance, --solver, --shift, --seed, --fps)",
                                answers_only, a.model));
            for (const char* required : {"--checkpoint", "--prompt"})
              if (command->get_option(required)->count() == 0)
                throw ConfigError(
                    fmt::format("generate: {} is required to make a clip with a job file", required));
            VideoGeneration video = a.video;
            video.config_path = a.model;
            video.out_dir = a.output;
            video.seed = a.sampling.seed;
            return run_generate_video(video);
          }};
}

}  // namespace loom::cli
