// loom data tokenize and loom data export: a tokenizer's ids for text or a chat, and a job's
// initial weights and first steps' micro-batches for a peer implementation.
#include <fmt/format.h>

#include <iostream>
#include <iterator>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "commands.h"
#include "loom/config/config.h"
#include "loom/data/chat_template.h"
#include "loom/data/tokenizer/tokenizer.h"
#include "loom/dist/launch_env.h"
#include "loom/tasks/flow_matching/features.h"
#include "loom/tasks/registry.h"
#include "loom/util/errors.h"
#include "loom/util/log.h"
#include "startup.h"

namespace loom::cli {

namespace {

// The text messages of a chat for the ChatML chat template, from JSON text: a list of messages or
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

// Text on standard input to ids, or with `chat` messages through the ChatML chat template (the one
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

std::vector<Command> add_data(CLI::App& loom) {
  auto* data_command = loom.add_subcommand("data", "Data tools: tokenize, export, extract-features");
  data_command->require_subcommand(1);

  struct TokenizeArguments {
    std::string tokenizer_path;
    bool chat = false, add_generation_prompt = false;
  };
  auto tokenize_arguments = std::make_shared<TokenizeArguments>();
  auto* tokenize = data_command->add_subcommand(
      "tokenize", "Print the token ids of UTF-8 text on standard input as one JSON array");
  tokenize
      ->add_option("--tokenizer", tokenize_arguments->tokenizer_path,
                   "tokenizer.json (BPE or WordLevel) or SentencePiece .model")
      ->required();
  tokenize->add_flag("--chat", tokenize_arguments->chat,
                     "Read messages JSON ([{\"role\": ..., \"content\": ...}] or {\"messages\": [...]}) and "
                     "apply the ChatML chat template training uses");
  tokenize
      ->add_flag("--add-generation-prompt", tokenize_arguments->add_generation_prompt,
                 "With --chat, end with the opening of the assistant's turn")
      ->needs("--chat");

  struct ExportArguments {
    std::string config_path, out_dir;
    std::vector<std::string> overrides;
    int64_t steps = 5;
  };
  auto export_arguments = std::make_shared<ExportArguments>();
  auto* export_command = data_command->add_subcommand(
      "export",
      "Write a job's initial weights, settings and first steps' micro-batches (with position ids) for a peer "
      "implementation to train on: loom data export job.yaml --out DIR");
  export_command->add_option("config", export_arguments->config_path, kConfigHelp)->required();
  export_command->add_option("--set", export_arguments->overrides, kOverrideHelp);
  export_command->add_option("--steps", export_arguments->steps, "Steps to write (default 5)");
  export_command->add_option("--out", export_arguments->out_dir, "Output directory")->required();

  struct ExtractArguments {
    std::string config_path, out_dir;
    std::vector<std::string> overrides;
    int64_t samples = 0;
  };
  auto extract_arguments = std::make_shared<ExtractArguments>();
  auto* extract_command =
      data_command->add_subcommand("extract-features",
                                   "Encode a flow_matching job's training clips (and held-out ones) once "
                                   "with its frozen VAE and text encoder, "
                                   "into data.features (or --out DIR), for the job to train on: loom data "
                                   "extract-features job.yaml [--samples N]");
  extract_command->add_option("config", extract_arguments->config_path, kConfigHelp)->required();
  extract_command->add_option("--set", extract_arguments->overrides, kOverrideHelp);
  extract_command->add_option(
      "--samples", extract_arguments->samples,
      "Training samples to encode, from the start of the job's stream (default: as many as "
      "its steps take, at most one epoch)");
  extract_command->add_option("--out", extract_arguments->out_dir,
                              "A new directory (default: the job's data.features)");

  return {{tokenize,
           [tokenize_arguments] {
             const auto& a = *tokenize_arguments;
             return run_tokenize(a.tokenizer_path, a.chat, a.add_generation_prompt);
           }},
          {export_command,
           [export_arguments] {
             const auto& a = *export_arguments;
             auto job = config::load_config(a.config_path, a.overrides);
             configure_logging(job.tools.log_level);
             use_threads(job.training.threads, 1);
             tasks::export_steps(job, a.out_dir, a.steps);  // the job built as loom train builds it
             return 0;
           }},
          {extract_command, [extract_arguments] {
             const auto& a = *extract_arguments;
             if (dist::launch_env_from_process().world_size > 1)
               throw ConfigError("data extract-features runs in one process, not under loom run");
             auto job = config::load_config(a.config_path, a.overrides);
             configure_logging(job.tools.log_level);
             use_threads(job.training.threads, 1);
             fmt::print("{}\n", tasks::flow_matching::extract_features(job, a.out_dir, a.samples));
             return 0;
           }}};
}

}  // namespace loom::cli
