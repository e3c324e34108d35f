#include "loom/tasks/vlm_sft/messages_data.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <filesystem>
#include <utility>

#include "loom/data/dataset_info.h"
#include "loom/tasks/vlm_sft/hf_files.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace fs = std::filesystem;

namespace {

data::DatasetFormat format_of(const std::string& name) {
  return name == "sharegpt" ? data::DatasetFormat::sharegpt
         : name == "alpaca" ? data::DatasetFormat::alpaca
                            : data::DatasetFormat::messages;
}

// A file of data.datasets as the reader takes it: named in data.dataset_info, as the registry
// describes it (its root and fields, when given, in place of the registry's); else at its path, in
// its format with its fields (format auto: detected when no fields are given, else messages).
data::DatasetSpec spec_of(const config::DatasetFile& file, const config::DataSection& data) {
  data::DatasetSpec spec;
  if (!file.name.empty()) {
    if (file.format != "auto")
      throw ConfigError(
          fmt::format("data.datasets: {}: format is given by the entry's formatting in {}; remove it",
                      file.name, data.dataset_info));
    spec = data::registry_dataset(data.dataset_info, file.name);
    if (!file.root.empty()) spec.root = file.root;
  } else {
    spec.path = file.path;
    spec.root = file.root;
    spec.format =
        file.format == "auto" && file.fields.empty() ? data::DatasetFormat::detect : format_of(file.format);
    spec.fields = data::field_names(spec.format);
  }
  data::set_field_names(spec.fields, file.fields, file.name.empty() ? file.path : file.name);
  spec.weight = file.weight;
  return spec;
}

std::string last_user_message(const data::Conversation& conversation) {
  for (auto it = conversation.messages.rbegin(); it != conversation.messages.rend(); ++it)
    if (it->role == data::Role::user) return it->content;
  return "";
}

// The templated conversation as an example, with its question (the last user message) and its
// question type (its file's name) for the evaluation report.
data::TokenizedExample to_example(const data::ConversationExample& built,
                                  const data::Conversation& conversation) {
  data::TokenizedExample ex = built.to_tokenized_example();
  ex.question = last_user_message(conversation);
  ex.question_type = fs::path(conversation.source).filename().string();
  return ex;
}

constexpr size_t kWarnedSkips = 20;  // skipped samples named in the log; the rest are counted

}  // namespace

MessagesData::MessagesData(const config::DataSection& data, uint64_t seed,
                           std::unique_ptr<data::ImageProcessor> processor)
    : section_(data),
      tokenizer_path_(data.tokenizer),
      tokenizer_(data::load_tokenizer(data.tokenizer)),
      skips_(64, data::warn_once_per_sample(kWarnedSkips)),
      processor_(std::move(processor)) {
  if (data.min_pixels > 0 || data.max_pixels > 0)
    processor_->set_pixel_bounds(data.min_pixels, data.max_pixels);
  if (data.video_min_pixels > 0 || data.video_max_pixels > 0)
    processor_->set_video_pixel_bounds(data.video_min_pixels, data.video_max_pixels);
  data::ChatTemplateOptions options;
  options.train_on_prompt = data.train_on_prompt;
  options.default_system = data.system_prompt.value_or(processor_->default_system());
  try {  // the checkpoint's template holds it: a message it cannot hold fails here, before any work
    data::chatml_template_jinja(options.default_system, processor_->block());
  } catch (const DataError& e) {
    throw ConfigError(fmt::format("data.system_prompt: {}", e.what()));
  }
  options.processor = processor_;
  options.video_fps = data.video_fps;
  options.video_max_frames = data.video_max_frames;
  template_ = std::make_unique<data::ChatTemplate>(*tokenizer_, options);
  options.generation_prompt = true;
  prompt_template_ = std::make_unique<data::ChatTemplate>(*tokenizer_, options);

  std::vector<data::DatasetSpec> specs;
  for (const auto& file : data.datasets) specs.push_back(spec_of(file, data));
  train_ = std::make_unique<data::ConversationMix>(specs, seed, skips_);
  // A held-out sample that cannot be used is an error, found here before any training: skipping
  // it would change what the evaluation measures, and finding it at the first evaluation would
  // cost the run up to then. Each is built once now as a prompt and as a training row (its images
  // decoded once for both), and dropped.
  for (const auto& file : data.eval_datasets) {
    data::SkipLog problems;
    auto samples = data::read_conversations(spec_of(file, data), problems);
    throw_if_unusable(problems);
    for (const data::Conversation& conversation : samples) {
      data::TokenizedExample prompt = held_out(conversation, /*with_replies=*/false);
      held_out(conversation, /*with_replies=*/true, std::move(prompt.images), std::move(prompt.videos));
    }
    eval_.insert(eval_.end(), std::make_move_iterator(samples.begin()),
                 std::make_move_iterator(samples.end()));
  }
  // The first eval_samples held-out samples, all of them when they are fewer.
  eval_samples_ = std::min(data.eval_samples, static_cast<int64_t>(eval_.size()));
  pad_id_ = padding_id(*tokenizer_);
  spdlog::info(
      "data: {} training conversations in {} files ({} per epoch of the mix), {} held out; {} "
      "samples skipped while reading",
      [&] {
        int64_t n = 0;
        for (size_t d = 0; d < train_->dataset_count(); ++d) n += train_->dataset_size(d);
        return n;
      }(),
      data.datasets.size(), train_->size(), eval_.size(), skips_.counts().total());
}

void MessagesData::save_tokenizer(const std::string& dir) const {
  const fs::path target = fs::path(dir) / (tokenizer_json() ? "tokenizer.json" : "tokenizer.model");
  std::error_code error;
  fs::copy_file(tokenizer_path_, target, fs::copy_options::overwrite_existing, error);
  if (error)
    throw DataError(fmt::format("cannot copy the tokenizer {} to {}: {}", tokenizer_path_, target.string(),
                                error.message()));
}

bool MessagesData::tokenizer_json() const { return fs::path(tokenizer_path_).extension() == ".json"; }

std::string MessagesData::chat_template() const {
  return data::chatml_template_jinja(template_->options().default_system, processor_->block());
}

TrainSamples MessagesData::train_examples(int64_t begin, int64_t end) const {
  TrainSamples out;
  for (int64_t i = begin; i < end; ++i) {
    const data::Conversation& conversation = train_->sample(i);
    auto built = template_->build(conversation, skips_);
    if (!built) {
      ++out.skipped;
      continue;
    }
    data::TokenizedExample ex = to_example(*built, conversation);
    if (fit_to_length(ex, section_, *tokenizer_, processor_->block(),
                      fmt::format("sample {} of {}", conversation.index, conversation.source), out))
      out.examples.push_back(std::move(ex));
  }
  return out;
}

data::TokenizedExample MessagesData::held_out(const data::Conversation& conversation, bool with_replies,
                                              std::vector<data::VisionInput> images,
                                              std::vector<data::VisionInput> videos) const {
  const data::ChatTemplate& chat = with_replies ? *template_ : *prompt_template_;
  std::optional<data::ConversationExample> built;
  if (images.empty() && videos.empty()) {
    data::SkipLog problems;
    built = chat.build(conversation, problems);
    if (!built) throw_if_unusable(problems);
  } else {
    built = chat.apply(conversation, std::move(images), std::move(videos));
  }
  data::TokenizedExample ex = to_example(*built, conversation);
  if (static_cast<int64_t>(ex.input_ids.size()) > section_.max_seq_len)
    throw DataError(fmt::format("held-out sample {} of {} has {} {}, more than data.max_seq_len {}",
                                conversation.index, conversation.source, ex.input_ids.size(),
                                with_replies ? "tokens with its replies" : "prompt tokens",
                                section_.max_seq_len));
  return ex;
}

data::Batch MessagesData::eval_examples(int64_t begin, int64_t end) const {
  std::vector<data::TokenizedExample> examples;
  for (int64_t i = begin; i < end; ++i)
    examples.push_back(held_out(eval_.at(static_cast<size_t>(i)), /*with_replies=*/true));
  return data::collate(examples, pad_id_);
}

int64_t MessagesData::epoch_samples() const { return train_->size(); }

data::Batch MessagesData::eval_prompts(int64_t begin, int64_t end) const {
  std::vector<data::TokenizedExample> examples;
  for (int64_t i = begin; i < end; ++i)
    examples.push_back(held_out(eval_.at(static_cast<size_t>(i)), /*with_replies=*/false));
  return data::collate(examples, pad_id_);
}

void MessagesData::throw_if_unusable(const data::SkipLog& problems) {
  const std::vector<data::SkipRecord> records = problems.records();
  if (records.empty()) return;
  const data::SkipRecord& problem = records.front();
  throw DataError(fmt::format("held-out sample {} of {} cannot be used ({}): {}", problem.sample_index,
                              problem.file, data::skip_kind_name(problem.kind), problem.reason));
}

}  // namespace loom::tasks
