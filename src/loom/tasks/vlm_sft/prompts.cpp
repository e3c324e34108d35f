#include "loom/tasks/vlm_sft/prompts.h"

#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>
#include <utility>

#include "loom/data/conversation.h"
#include "loom/data/image/decode.h"
#include "loom/data/tokenizer/word_tokenizer.h"
#include "loom/tasks/vlm_sft/hf_files.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace fs = std::filesystem;

namespace {

constexpr const char* kSystemStart = "<|im_start|>system\n";

nlohmann::json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw DataError(fmt::format("{}: cannot be read", path.string()));
  try {
    return nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    throw DataError(fmt::format("{}: not valid JSON ({})", path.string(), e.what()));
  }
}

// tokenizer.json, else the directory's one SentencePiece model (tokenizer.model as Loom saves it).
std::string tokenizer_file(const fs::path& dir) {
  if (fs::is_regular_file(dir / "tokenizer.json")) return (dir / "tokenizer.json").string();
  std::vector<std::string> models;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().extension() == ".model") models.push_back(entry.path().string());
  if (models.size() == 1) return models[0];
  throw DataError(fmt::format("{}: no tokenizer (tokenizer.json or one SentencePiece .model file){}",
                              dir.string(), models.empty() ? "" : ", but several .model files"));
}

// The chat template and the file it came from; empty when there is none.
std::pair<std::string, std::string> chat_template_of(const fs::path& dir) {
  // chat_template.jinja: the template itself, as transformers 5 saves it.
  if (const fs::path jinja = dir / "chat_template.jinja"; fs::is_regular_file(jinja)) {
    std::ifstream in(jinja, std::ios::binary);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    if (!in.good() && !in.eof()) throw DataError(fmt::format("{}: cannot be read", jinja.string()));
    return {text, jinja.string()};
  }
  for (const char* name : {"chat_template.json", "tokenizer_config.json"}) {
    const fs::path path = dir / name;
    if (!fs::is_regular_file(path)) continue;
    const nlohmann::json json = read_json(path);
    if (!json.contains("chat_template")) continue;
    const nlohmann::json& given = json["chat_template"];
    if (given.is_string()) return {given.get<std::string>(), path.string()};
    // Several named templates, as some tokenizer_config.json files hold them: the default one.
    if (given.is_array())
      for (const auto& named : given)
        if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
            named["template"].is_string())
          return {named["template"].get<std::string>(), path.string()};
    throw DataError(fmt::format(
        "{}: chat_template is neither a string nor a list holding one named 'default'", path.string()));
  }
  return {};
}

// The image file, decoded; DataError naming `source` (the prompt) too.
data::Image read_image(const std::string& path, const std::string& source) {
  try {
    return data::decode_image_file(path);
  } catch (const DataError& e) {
    throw DataError(fmt::format("{}: {}", source, e.what()));
  }
}

std::vector<data::VisionInput> processed_images(const std::vector<std::string>& paths,
                                                const data::ImageProcessor& processor,
                                                const std::string& source) {
  std::vector<data::VisionInput> out;
  for (const std::string& path : paths) out.push_back(processor.process(read_image(path, source)));
  return out;
}

}  // namespace

ChatPrompts::ChatPrompts(const std::string& dir, std::unique_ptr<data::ImageProcessor> processor)
    : tokenizer_(data::load_tokenizer(tokenizer_file(dir))), processor_(std::move(processor)) {
  const data::ImageBlock& block = processor_->block();
  const std::string image_block = block.template_text();
  const auto [text, file] = chat_template_of(dir);
  if (text.empty())
    throw DataError(
        fmt::format("{}: no chat template (chat_template.jinja, chat_template.json or "
                    "tokenizer_config.json's chat_template), so Loom cannot tell how its prompts are written",
                    dir));
  if (text == data::vqa_template_jinja(block)) {
    format_ = PromptFormat::vqa;
    if (!dynamic_cast<const data::WordTokenizer*>(tokenizer_.get()))
      throw DataError(fmt::format("{}: the built-in VQA template needs a word-level tokenizer", file));
    return;
  }
  // An image is the processor's block, or (as transformers' processors expand it) its pad token alone.
  if (text.find("<|im_start|>") == std::string::npos ||
      (text.find(image_block) == std::string::npos && text.find(block.pad) == std::string::npos))
    throw DataError(fmt::format(
        "{}: the chat template is neither ChatML with this model's image block (<|im_start|>, {} for an "
        "image) nor Loom's VQA template; Loom writes prompts in those two formats only",
        file, image_block));
  // The default system message, when the template writes one.
  if (const size_t system = text.find(kSystemStart); system != std::string::npos) {
    const size_t begin = system + std::string(kSystemStart).size();
    const size_t end = text.find("<|im_end|>", begin);
    if (end == std::string::npos)
      throw DataError(fmt::format("{}: the default system message never ends", file));
    default_system_ = text.substr(begin, end - begin);
  }
  data::ChatTemplateOptions options;
  options.default_system = default_system_;
  options.generation_prompt = true;
  options.processor = processor_;
  template_ = std::make_unique<data::ChatTemplate>(*tokenizer_, options);
}

data::TokenizedExample ChatPrompts::prompt(std::vector<data::Message> messages,
                                           const std::vector<std::string>& images,
                                           const std::string& source) const {
  int64_t placeholders = 0;
  for (const data::Message& m : messages) placeholders += data::count_image_placeholders(m.content);
  if (placeholders == 0 && !images.empty()) {
    for (data::Message& m : messages)
      if (m.role == data::Role::user) {
        std::string before;
        for (size_t i = 0; i < images.size(); ++i) before += data::kImagePlaceholder;
        m.content = before + m.content;
        break;
      }
  } else if (placeholders != static_cast<int64_t>(images.size())) {
    throw DataError(fmt::format("{}: {} {} placeholders but {} images", source, placeholders,
                                data::kImagePlaceholder, images.size()));
  }
  if (messages.empty() || messages.back().role != data::Role::user)
    throw DataError(fmt::format("{}: a prompt ends with a user message", source));
  if (const std::string problem = data::chat_problem(messages); !problem.empty())
    throw DataError(fmt::format("{}: {}", source, problem));

  if (format_ == PromptFormat::vqa) {
    if (messages.size() != 1 || images.size() != 1)
      throw DataError(fmt::format(
          "{}: this model's prompt format (the built-in VQA sets') takes one question about one image, "
          "got {} messages and {} images",
          source, messages.size(), images.size()));
    std::string question = messages[0].content;
    const std::string placeholder = data::kImagePlaceholder;
    question.erase(question.find(placeholder), placeholder.size());
    data::VqaSample sample;
    sample.image = read_image(images[0], source);
    sample.question = question;
    return data::build_vqa_example(static_cast<const data::WordTokenizer&>(*tokenizer_), sample, *processor_,
                                   /*with_answer=*/false);
  }
  data::Conversation conversation;
  conversation.messages = std::move(messages);
  conversation.messages.push_back({data::Role::assistant, ""});  // the answer to come: left out
  conversation.images = images;
  conversation.source = source;
  data::ConversationExample built =
      template_->apply(conversation, processed_images(images, *processor_, source));
  data::TokenizedExample ex = built.to_tokenized_example();
  ex.question = conversation.messages[conversation.messages.size() - 2].content;
  return ex;
}

}  // namespace loom::tasks
