#include "loom/tasks/vlm_sft/task.h"

#include <ATen/Parallel.h>
#include <fmt/format.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "loom/checkpoint/checkpoint_dir.h"
#include "loom/checkpoint/safetensors.h"
#include "loom/data/batching.h"
#include "loom/kernels/cross_entropy.h"
#include "loom/models/weights.h"
#include "loom/nn/fused.h"
#include "loom/parallel/cross_entropy.h"
#include "loom/tasks/registry.h"
#include "loom/tasks/vlm_sft/generate.h"
#include "loom/tasks/vlm_sft/hf_files.h"
#include "loom/util/errors.h"

namespace loom::tasks {

namespace {

// Checks that the ids the model was configured with are the tokenizer's.
void check_token_ids(const models::VisionLanguageModel& model, const data::Tokenizer& tokenizer) {
  for (const models::SpecialToken& token : model.special_tokens()) {
    const int64_t expected = tokenizer.id(token.text);
    if (token.id != expected)
      throw ConfigError(fmt::format("model.hf_config.{}: {} is not the tokenizer's id of {} ({})", token.key,
                                    token.id, token.text, expected));
  }
  if (model.vocab_size() < tokenizer.vocab_size())
    throw ConfigError(fmt::format("model.hf_config.vocab_size: {} is smaller than the tokenizer's {} tokens",
                                  model.vocab_size(), tokenizer.vocab_size()));
}

// The cross entropy of the LM head's predictions from `predicting` (..., hidden) against `targets`
// (one per prediction, flat), summed over the targets that are not ignored. Under tensor
// parallelism the LM head gives this rank's slice of the vocabulary and the loss is computed on the
// slices; otherwise, with fused kernels, the head and the loss run chunk by chunk without the whole
// logits.
at::Tensor prediction_loss_sum(const models::VisionLanguageModel& model, const at::Tensor& predicting,
                               const at::Tensor& host_targets) {
  const at::Tensor targets = host_targets.to(predicting.device(), /*non_blocking=*/true);
  const int64_t width = predicting.size(-1);
  const auto& tp = model.llm_tp();
  if (tp.size() == 1 && nn::fused_kernels())
    return kernels::linear_cross_entropy_sum(predicting.reshape({-1, width}), model.lm_head_weight(), targets,
                                             data::kIgnoreIndex);
  auto logits = model.logits(predicting);
  auto predicted = logits.reshape({-1, logits.size(-1)}).to(at::kFloat);
  if (tp.size() > 1)
    return parallel::vocab_parallel_cross_entropy_sum(predicted, targets, tp.comm, model.vocab_start(),
                                                      data::kIgnoreIndex);
  return at::cross_entropy_loss(predicted, targets, {}, at::Reduction::Sum, data::kIgnoreIndex);
}

// Each token predicts the next label of its row: hidden (B, L, hidden), labels (B, L).
at::Tensor token_loss_sum(const models::VisionLanguageModel& model, const at::Tensor& hidden,
                          const at::Tensor& labels) {
  const int64_t length = hidden.size(1);
  return prediction_loss_sum(model, hidden.narrow(1, 0, length - 1),
                             labels.narrow(1, 1, length - 1).reshape({-1}));
}

// Under context parallelism: `hidden` (1, local tokens, hidden) is this rank's shard of the tokens,
// and each predicts the label after it in its row, sharded alike (the last token of a row and the
// padding predict nothing).
at::Tensor sharded_token_loss_sum(const models::VisionLanguageModel& model, const at::Tensor& hidden,
                                  const at::Tensor& labels, const parallel::ContextShard& shard) {
  const at::Tensor next = at::cat({labels.narrow(1, 1, labels.size(1) - 1),
                                   at::full({labels.size(0), 1}, data::kIgnoreIndex, labels.options())},
                                  1);
  return prediction_loss_sum(model, hidden[0], shard.scatter(next.flatten(), data::kIgnoreIndex));
}

// One held-out question with the model's greedy answer.
struct Prediction {
  std::string question, answer, predicted, question_type;
};

}  // namespace

models::VisionLanguageInputs model_inputs(const data::Batch& batch) {
  models::VisionLanguageInputs in;
  in.input_ids = batch.input_ids;
  in.attention_mask = batch.attention_mask;
  in.pixel_values = batch.pixel_values;
  in.image_grid_thw = batch.image_grid_thw;
  in.pixel_values_videos = batch.pixel_values_videos;
  in.video_grid_thw = batch.video_grid_thw;
  in.second_per_grid_ts = batch.second_per_grid_ts;
  in.cu_seqlens = batch.cu_seqlens;
  return in;
}

VlmSftTask::VlmSftTask(const config::JobConfig& job, std::shared_ptr<models::VisionLanguageModel> model,
                       const core::Layout& layout,
                       std::map<int64_t, parallel::ContextParallelGroup> context_parallel,
                       std::unique_ptr<data::ImageProcessor> processor)
    : data_section_(job.data),
      init_from_(job.model.init_from),
      global_batch_(job.training.global_batch_size),
      micro_batch_(job.training.micro_batch_size),
      dynamic_cp_tokens_(job.parallel.dynamic_cp ? job.parallel.dynamic_cp_tokens : 0),
      context_parallel_(std::move(context_parallel)),
      model_(std::move(model)),
      layout_(layout) {
  data_ = make_job_data(job.data, models::derive_seed(static_cast<uint64_t>(job.training.seed), "data"),
                        std::move(processor));
  check_token_ids(*model_, data_->tokenizer());
}

std::vector<data::TokenizedExample> VlmSftTask::step_samples(int64_t step, core::StepData* counts) const {
  auto samples = data_->train_examples(step * global_batch_, (step + 1) * global_batch_);
  if (samples.examples.empty())
    throw DataError(fmt::format(
        "step {}: none of its {} samples is usable ({} over data.max_seq_len {} dropped, {} skipped)",
        step + 1, global_batch_, samples.dropped, data_section_.max_seq_len, samples.skipped));
  if (counts && layout_.data_rank() == 0) {  // every rank read the whole step: rank 0 counts it
    counts->truncated = samples.truncated;
    counts->dropped = samples.dropped;
    counts->skipped = samples.skipped;
  }
  return std::move(samples.examples);
}

int64_t VlmSftTask::dynamic_degree(int64_t step, const std::vector<data::TokenizedExample>& samples) const {
  std::vector<int64_t> lengths;
  for (const data::TokenizedExample& sample : samples) lengths.push_back(data::cost_of(sample).tokens);
  const int64_t cp = layout_.context_parallel();
  const int64_t degree = data::context_degree(lengths, layout_.data_parallel(), cp, dynamic_cp_tokens_);
  if (degree > 0) return degree;
  const auto longest = std::max_element(lengths.begin(), lengths.end());
  throw DataError(
      fmt::format("step {}: sample {} of its {} holds {} tokens, more than parallel.cp={} ranks hold at "
                  "parallel.dynamic_cp_tokens={} each ({} tokens); raise either, or lower data.max_seq_len",
                  step + 1, longest - lengths.begin() + 1, lengths.size(), *longest, cp, dynamic_cp_tokens_,
                  cp * dynamic_cp_tokens_));
}

int64_t VlmSftTask::epoch_samples() const { return data_->epoch_samples(); }

void VlmSftTask::save_artifacts(const std::string& dir) const {
  data_->save_tokenizer(dir);
  const auto write = [&dir](const std::string& name, const nlohmann::ordered_json& json) {
    checkpoint::write_text_file_durable(dir + "/" + name, json.dump(2) + "\n");
  };
  const data::ImageProcessor& processor = data_->processor();
  write("preprocessor_config.json", processor.preprocessor_config());
  const nlohmann::ordered_json video_config = processor.video_preprocessor_config();
  if (!video_config.is_null()) write("video_preprocessor_config.json", video_config);
  const nlohmann::ordered_json processor_config = processor.processor_config();
  if (!processor_config.is_null()) write("processor_config.json", processor_config);
  const std::string chat_template = data_->chat_template();
  write("tokenizer_config.json",
        tokenizer_config(data_->tokenizer(), data_->tokenizer_json(), chat_template,
                         model_->max_position_embeddings(), processor.named_tokens()));
  write("chat_template.json", {{"chat_template", chat_template}});
  const std::filesystem::path given = std::filesystem::path(init_from_) / "generation_config.json";
  if (!init_from_.empty() && std::filesystem::is_regular_file(given))
    std::filesystem::copy_file(given, dir + "/generation_config.json");
  else
    write("generation_config.json", generation_config(data_->tokenizer(), model_->bos_token_id()));
}

core::StepData VlmSftTask::step_data(int64_t step) const {
  core::StepData out;
  std::vector<data::TokenizedExample> samples = step_samples(step, &out);
  // Every rank reads the step's samples, so every rank picks the same degree, and keeps the balanced
  // share (balance_across_ranks) of the ranks that split its samples' tokens.
  const int64_t degree = dynamic_cp_tokens_ > 0 ? dynamic_degree(step, samples) : 0;
  out.context_parallel = degree;
  const data::MicroBatching batching{micro_batch_, data_section_.packing, padding_id(data_->tokenizer()),
                                     layout_.data_shard(degree), layout_.data_shards(degree)};
  for (data::Batch& batch : data::rank_micro_batches(std::move(samples), batching)) {
    out.loss_count += static_cast<double>(batch.num_target_tokens);
    auto micro = std::make_shared<VlmMicroBatch>();
    micro->batch = std::move(batch);
    micro->context_parallel = degree;
    out.micro_batches.push_back(std::move(micro));
  }
  return out;
}

std::vector<data::Batch> VlmSftTask::whole_step(int64_t step) const {
  const data::MicroBatching batching{micro_batch_, data_section_.packing, padding_id(data_->tokenizer()), 0,
                                     1};
  return data::rank_micro_batches(step_samples(step, nullptr), batching);
}

std::vector<std::pair<std::string, at::Tensor>> VlmSftTask::export_step(int64_t step) const {
  const std::vector<data::Batch> micro_batches = whole_step(step);
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  for (size_t m = 0; m < micro_batches.size(); ++m) {
    const data::Batch& b = micro_batches[m];
    const std::string key = std::to_string(m) + ".";
    tensors.emplace_back(key + "input_ids", b.input_ids);
    tensors.emplace_back(key + "labels", b.labels);
    tensors.emplace_back(key + "attention_mask", b.attention_mask);
    tensors.emplace_back(key + "position_ids", model_->position_ids(model_inputs(b)));
    if (b.pixel_values.defined() && b.pixel_values.numel() > 0) {
      tensors.emplace_back(key + "pixel_values", b.pixel_values);
      tensors.emplace_back(key + "image_grid_thw", b.image_grid_thw);
    }
    if (b.pixel_values_videos.defined() && b.pixel_values_videos.numel() > 0) {
      tensors.emplace_back(key + "pixel_values_videos", b.pixel_values_videos);
      tensors.emplace_back(key + "video_grid_thw", b.video_grid_thw);
      tensors.emplace_back(key + "second_per_grid_ts", at::tensor(b.second_per_grid_ts, at::kDouble));
    }
    if (b.packed()) tensors.emplace_back(key + "cu_seqlens", at::tensor(b.cu_seqlens, at::kLong));
  }
  return tensors;
}

core::ForwardResult VlmSftTask::forward(const core::MicroBatch& micro, const core::Stage& stage,
                                        core::Carry input) {
  const auto& vlm = static_cast<const VlmMicroBatch&>(micro);
  const data::Batch& batch = vlm.batch;
  core::ForwardResult out;
  const auto context = model_->sharded_context(
      model_inputs(batch),
      context_parallel_.at(vlm.context_parallel > 0 ? vlm.context_parallel : layout_.context_parallel()));
  core::Carry carry = stage.forward(std::move(input), context);
  if (stage.last && context->text_shard.enabled())
    out.loss_sum = sharded_token_loss_sum(*model_, carry.get("hidden"), batch.labels, context->text_shard);
  else if (stage.last)
    out.loss_sum = token_loss_sum(*model_, carry.get("hidden"), batch.labels);
  else
    out.output = std::move(carry);
  if (stage.last && carry.has("expert_tokens")) out.expert_tokens = carry.get("expert_tokens");
  if (stage.last && carry.has("aux_loss")) {
    // A model's own loss beside the tokens' (a router's load balancing, already times its
    // coefficient), once per micro-batch: weighted by its target tokens, so the step's mean over
    // target tokens is the token loss's mean plus it, as transformers adds it to a batch's loss.
    const int64_t targets =
        batch.labels.narrow(1, 1, batch.labels.size(1) - 1).ne(data::kIgnoreIndex).sum().item<int64_t>();
    out.loss_sum = out.loss_sum + carry.get("aux_loss") * static_cast<double>(targets);
  }
  out.tokens = batch.attention_mask.sum().item<int64_t>();
  const std::vector<int64_t> lengths = batch.sequence_lengths();
  out.samples = static_cast<int64_t>(lengths.size());
  out.flops =
      model_->training_flops(lengths, batch.video_grid_thw.defined() && batch.video_grid_thw.size(0) > 0
                                          ? at::cat({batch.image_grid_thw, batch.video_grid_thw})
                                          : batch.image_grid_thw);
  return out;
}

std::map<std::string, std::pair<double, int64_t>> VlmSftTask::held_out_loss() const {
  constexpr int64_t kBatch = 100;
  std::map<std::string, std::pair<double, int64_t>> sums;
  const auto& data_comm = layout_.data();
  const int64_t ranks = data_comm ? data_comm->size() : 1, rank = layout_.data_rank();
  for (int64_t begin = 0, index = 0; begin < data_->eval_samples(); begin += kBatch, ++index) {
    if (index % ranks != rank) continue;
    const data::Batch batch = data_->eval_examples(begin, std::min(begin + kBatch, data_->eval_samples()));
    const at::Tensor hidden = model_->hidden_states(model_inputs(batch));
    for (int64_t r = 0; r < batch.input_ids.size(0); ++r) {
      const at::Tensor labels = batch.labels.narrow(0, r, 1);
      auto& [sum, count] = sums[batch.question_types[static_cast<size_t>(r)]];
      sum += token_loss_sum(*model_, hidden.narrow(0, r, 1), labels).item<double>();
      count += labels.narrow(1, 1, labels.size(1) - 1).ne(data::kIgnoreIndex).sum().item<int64_t>();
    }
  }
  if (!data_comm) return sums;
  nlohmann::json mine = nlohmann::json::array();
  for (const auto& [type, entry] : sums)
    // As text, so a diverged (non-finite) loss survives the JSON.
    mine.push_back({{"type", type}, {"sum", fmt::format("{:.17g}", entry.first)}, {"count", entry.second}});
  sums.clear();
  for (const std::string& text : data_comm->all_gather(mine.dump()))
    for (const auto& row : nlohmann::json::parse(text)) {
      auto& entry = sums[row.at("type").get<std::string>()];
      entry.first += std::stod(row.at("sum").get<std::string>());
      entry.second += row.at("count").get<int64_t>();
    }
  return sums;
}

core::Evaluation VlmSftTask::evaluate(int64_t) {
  at::NoGradGuard no_grad;
  constexpr int64_t kBatch = 100;
  const auto& tokenizer = data_->tokenizer();
  SamplingOptions greedy;
  greedy.max_new_tokens = data_section_.eval_max_new_tokens;
  const GenerationTokens special = generation_tokens(tokenizer);
  // Batches are dealt round-robin to the data-parallel ranks (the ranks of a tensor-parallel
  // group decode the same batch together); each scored answer keeps its position in the held-out
  // set so the gathered result is in eval order on every rank.
  struct Scored {
    int64_t position;
    Prediction prediction;
    bool correct;
  };
  std::vector<Scored> scored;
  const auto& data_comm = layout_.data();
  const int64_t ranks = data_comm ? data_comm->size() : 1, rank = layout_.data_rank();
  for (int64_t begin = 0, index = 0; begin < data_->eval_samples(); begin += kBatch, ++index) {
    if (index % ranks != rank) continue;
    const int64_t end = std::min(begin + kBatch, data_->eval_samples());
    const data::Batch batch = data_->eval_prompts(begin, end);
    const Generated answers = generate(*model_, batch, special, greedy);
    for (size_t r = 0; r < answers.tokens.size(); ++r) {
      const std::string predicted = tokenizer.decode(answers.tokens[r]);
      const bool finished = answers.finished[r];
      scored.push_back({begin + static_cast<int64_t>(r),
                        {batch.questions[r], batch.answers[r], finished ? predicted : predicted + " ...",
                         batch.question_types[r]},
                        finished && predicted == batch.answers[r]});
    }
  }
  if (data_comm) {
    nlohmann::json mine = nlohmann::json::array();
    for (const Scored& s : scored)
      mine.push_back({s.position, s.prediction.question, s.prediction.answer, s.prediction.predicted,
                      s.prediction.question_type, s.correct});
    scored.clear();
    for (const std::string& text : data_comm->all_gather(mine.dump()))
      for (const auto& row : nlohmann::json::parse(text))
        scored.push_back({row[0].get<int64_t>(),
                          {row[1].get<std::string>(), row[2].get<std::string>(), row[3].get<std::string>(),
                           row[4].get<std::string>()},
                          row[5].get<bool>()});
    std::sort(scored.begin(), scored.end(),
              [](const Scored& a, const Scored& b) { return a.position < b.position; });
  }

  core::Evaluation result;
  result.samples = static_cast<int64_t>(scored.size());
  if (result.samples == 0) {
    result.summary = "no held-out samples (data.eval_datasets is empty): nothing to evaluate";
    result.report = "eval: no held-out samples, nothing evaluated\n";
    return result;
  }
  std::map<std::string, int64_t> correct_by_type, samples_by_type;
  int64_t correct = 0;
  for (const Scored& s : scored) {
    correct += s.correct;
    correct_by_type[s.prediction.question_type] += s.correct;
    samples_by_type[s.prediction.question_type] += 1;
    const Prediction& p = s.prediction;
    result.records.push_back(nlohmann::json{{"question", p.question},
                                            {"answer", p.answer},
                                            {"predicted", p.predicted},
                                            {"question_type", p.question_type}});
  }
  const double accuracy = static_cast<double>(correct) / static_cast<double>(result.samples);
  result.metrics.emplace_back("eval_accuracy", accuracy);
  result.report = fmt::format("eval: exact-match accuracy {:.2f}% on {} held-out questions\n", 100 * accuracy,
                              result.samples);
  std::string by_type;
  for (const auto& [type, n] : samples_by_type) {
    const double type_accuracy = static_cast<double>(correct_by_type[type]) / static_cast<double>(n);
    result.metrics.emplace_back("eval_accuracy_" + type, type_accuracy);
    by_type += fmt::format("{}{} {:.1f}%", by_type.empty() ? "" : ", ", type, 100 * type_accuracy);
    result.report += fmt::format("  {:<10} {:6.2f}%  ({} questions)\n", type, 100 * type_accuracy, n);
  }
  result.summary = fmt::format("eval accuracy {:.2f}% on {} held-out questions ({})", 100 * accuracy,
                               result.samples, by_type);
  // The held-out loss, as training computes its loss, and its perplexity.
  double loss_sum = 0;
  int64_t tokens = 0;
  std::string loss_by_type;
  const auto losses = held_out_loss();
  for (const auto& [type, entry] : losses) {
    loss_sum += entry.first;
    tokens += entry.second;
  }
  const double loss = tokens > 0 ? loss_sum / static_cast<double>(tokens) : 0.0;
  result.metrics.emplace_back("eval_loss", loss);
  result.metrics.emplace_back("eval_perplexity", std::exp(loss));
  result.report += fmt::format("eval: held-out loss {:.4f} (perplexity {:.3f}) over {} answer tokens\n", loss,
                               std::exp(loss), tokens);
  for (const auto& [type, entry] : losses) {
    const double type_loss = entry.second > 0 ? entry.first / static_cast<double>(entry.second) : 0.0;
    result.metrics.emplace_back("eval_loss_" + type, type_loss);
    result.metrics.emplace_back("eval_perplexity_" + type, std::exp(type_loss));
    result.report += fmt::format("  {:<10} loss {:.4f}  perplexity {:.3f}  ({} tokens)\n", type, type_loss,
                                 std::exp(type_loss), entry.second);
  }
  result.summary += fmt::format(", loss {:.4f}", loss);
  return result;
}

}  // namespace loom::tasks
