// Typing the YAML tree into JobConfig: every key known, every value typed and range-checked.
#include "loom/config/config.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "loom/config/yaml_tree.h"
#include "loom/util/errors.h"

namespace loom::config {
namespace {

std::string join_list(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diagonal = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

// "; did you mean 'lr'?" when one valid name is a small typo away, else "".
std::string suggestion(const std::string& unknown, const std::vector<std::string>& valid) {
  const std::string* best = nullptr;
  size_t best_distance = 3;
  for (const auto& name : valid) {
    const size_t d = edit_distance(unknown, name);
    if (d < best_distance) best = &name, best_distance = d;
  }
  return best ? fmt::format("; did you mean '{}'?", *best) : "";
}

// One section of the job: refuses keys it does not know and reads the ones present into fields,
// leaving defaults for the ones absent.
class SectionReader {
 public:
  SectionReader(const YamlValue* section, std::string name, std::vector<std::string> valid,
                std::string document_source)
      : name_(std::move(name)), valid_(std::move(valid)), document_source_(std::move(document_source)) {
    if (!section || section->kind == YamlValue::Kind::Null) return;
    if (section->kind != YamlValue::Kind::Mapping)
      fail_at(*section, name_,
              fmt::format("expected a mapping of keys ({}), got {}", join_list(valid_), describe(*section)));
    section_ = section;
    for (const auto& [key, value] : section->entries) {
      if (std::find(valid_.begin(), valid_.end(), key) == valid_.end())
        throw ConfigError(fmt::format("{}: unknown key '{}' (valid keys in {}: {}{})", value.source,
                                      key_of(key), name_, join_list(valid_), suggestion(key, valid_)));
    }
  }

  const YamlValue* get(const std::string& key) const { return section_ ? section_->find(key) : nullptr; }
  std::string key_of(const std::string& key) const { return name_ + "." + key; }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const YamlValue* value = get(key);
    throw ConfigError(locate(value ? value->source : document_source_, key_of(key)) + ": " + what);
  }
  [[noreturn]] void missing(const std::string& key, const std::string& hint) const {
    throw ConfigError(fmt::format("{}: missing required key '{}' ({})", document_source_, key_of(key), hint));
  }

  void read(const std::string& key, int64_t& out) const {
    if (const YamlValue* v = get(key)) out = as_integer(*v, key_of(key));
  }
  void read(const std::string& key, double& out) const {
    if (const YamlValue* v = get(key)) out = as_double(*v, key_of(key));
  }
  void read(const std::string& key, bool& out) const {
    if (const YamlValue* v = get(key)) out = as_bool(*v, key_of(key));
  }
  void read(const std::string& key, std::string& out) const {
    if (const YamlValue* v = get(key)) out = as_string(*v, key_of(key));
  }
  void read(const std::string& key, std::vector<std::string>& out) const {
    if (const YamlValue* v = get(key)) out = as_string_list(*v, key_of(key));
  }

  void at_least(const std::string& key, int64_t value, int64_t min) const {
    if (value < min) fail(key, fmt::format("must be >= {}, got {}", min, value));
  }
  void at_least(const std::string& key, double value, double min) const {
    if (value < min) fail(key, fmt::format("must be >= {}, got {}", min, value));
  }
  void above(const std::string& key, double value, double bound) const {
    if (!(value > bound)) fail(key, fmt::format("must be > {}, got {}", bound, value));
  }
  void in_unit_interval(const std::string& key, double value) const {
    if (value < 0.0 || value >= 1.0) fail(key, fmt::format("must be in [0, 1), got {}", value));
  }
  void one_of(const std::string& key, const std::string& value, const std::vector<std::string>& valid) const {
    if (std::find(valid.begin(), valid.end(), value) == valid.end())
      fail(key, fmt::format("'{}' is not one of {}", value, join_list(valid)));
  }
  void not_empty(const std::string& key, const std::string& value, const std::string& hint) const {
    if (value.empty()) fail(key, fmt::format("must not be empty ({})", hint));
  }

 private:
  const YamlValue* section_ = nullptr;
  std::string name_;
  std::vector<std::string> valid_;
  std::string document_source_;
};

ModelSection read_model(const YamlValue* section, const std::string& source) {
  const SectionReader r(section, "model", {"family", "hf_config", "init_from", "freeze"}, source);
  ModelSection m;
  if (!r.get("family")) r.missing("family", "one of qwen2_vl, qwen2_5_vl");
  r.read("family", m.family);
  r.one_of("family", m.family, {"qwen2_vl", "qwen2_5_vl"});

  const YamlValue* hf = r.get("hf_config");
  if (!hf) r.missing("hf_config", "a path to a HF config.json, or its fields as an inline mapping");
  if (hf->kind == YamlValue::Kind::Scalar) {
    m.hf_config_path = hf->scalar;
    r.not_empty("hf_config", m.hf_config_path, "a path to a HF config.json, or an inline mapping");
  } else if (hf->kind == YamlValue::Kind::Mapping) {
    if (hf->entries.empty()) r.fail("hf_config", "the inline mapping is empty");
    m.hf_config = to_json(*hf, r.key_of("hf_config"));
  } else {
    r.fail("hf_config",
           fmt::format("expected a path to a HF config.json or an inline mapping of its fields, got {}",
                       describe(*hf)));
  }

  r.read("init_from", m.init_from);
  r.read("freeze", m.freeze);
  for (size_t i = 0; i < m.freeze.size(); ++i)
    if (m.freeze[i].empty()) r.fail("freeze", fmt::format("entry {} is an empty module prefix", i));
  return m;
}

// data.datasets / data.eval_datasets: a list of mappings, one per conversation file.
std::vector<DatasetFile> read_dataset_files(const YamlValue* list, const std::string& key,
                                            const std::string& source) {
  std::vector<DatasetFile> files;
  if (!list || list->kind == YamlValue::Kind::Null) return files;
  if (list->kind != YamlValue::Kind::Sequence)
    fail_at(*list, key,
            fmt::format(
                "expected a list of {{path: ..., root: ..., weight: ..., fields: {{...}}}} entries, got {}",
                describe(*list)));
  static const std::vector<std::string> kFields = {"messages", "images", "videos",    "role",
                                                   "content",  "user",   "assistant", "system"};
  for (size_t i = 0; i < list->items.size(); ++i) {
    const std::string name = fmt::format("{}[{}]", key, i);
    const SectionReader r(&list->items[i], name, {"path", "root", "weight", "fields"}, source);
    DatasetFile f;
    if (!r.get("path")) r.missing("path", "the conversation file: a JSON array or JSON lines");
    r.read("path", f.path);
    r.not_empty("path", f.path, "the conversation file: a JSON array or JSON lines");
    r.read("root", f.root);
    r.read("weight", f.weight);
    r.above("weight", f.weight, 0.0);
    if (const YamlValue* fields = r.get("fields")) {
      const SectionReader fr(fields, name + ".fields", kFields, source);
      for (const auto& field : kFields) {
        std::string value;
        fr.read(field, value);
        if (fr.get(field)) {
          fr.not_empty(field, value, "the key or role name the file uses");
          f.fields[field] = value;
        }
      }
    }
    files.push_back(std::move(f));
  }
  return files;
}

DataSection read_data(const YamlValue* section, const std::string& source) {
  const SectionReader r(section, "data",
                        {"dataset", "tokenizer", "datasets", "eval_datasets", "train_on_prompt", "min_pixels",
                         "max_pixels", "dir", "image_size", "hflip", "shift", "eval_samples", "max_seq_len",
                         "overlong", "packing", "num_workers", "prefetch"},
                        source);
  DataSection d;
  r.read("dataset", d.dataset);
  r.one_of("dataset", d.dataset, {"shapes_vqa", "fashion_mnist", "messages"});
  const bool messages = d.dataset == "messages";
  // Keys of the other kind of dataset would be ignored: refuse them.
  for (const char* key :
       {"tokenizer", "datasets", "eval_datasets", "train_on_prompt", "min_pixels", "max_pixels"})
    if (!messages && r.get(key))
      r.fail(key, fmt::format("is only used by dataset messages, not {}; remove it", d.dataset));
  for (const char* key : {"dir", "image_size"})
    if (messages && r.get(key))
      r.fail(key,
             "is not used by dataset messages (images are sized by min_pixels and max_pixels); remove it");
  r.read("tokenizer", d.tokenizer);
  d.datasets = read_dataset_files(r.get("datasets"), r.key_of("datasets"), source);
  d.eval_datasets = read_dataset_files(r.get("eval_datasets"), r.key_of("eval_datasets"), source);
  if (messages) {
    if (!r.get("tokenizer")) r.missing("tokenizer", "a HuggingFace tokenizer.json or a SentencePiece .model");
    r.not_empty("tokenizer", d.tokenizer, "a HuggingFace tokenizer.json or a SentencePiece .model");
    if (d.datasets.empty()) r.missing("datasets", "a list of {path: FILE} conversation files to train on");
  }
  r.read("train_on_prompt", d.train_on_prompt);
  r.read("min_pixels", d.min_pixels);
  r.at_least("min_pixels", d.min_pixels, int64_t{1});
  r.read("max_pixels", d.max_pixels);
  if (d.max_pixels < d.min_pixels)
    r.fail("max_pixels", fmt::format("must be >= min_pixels ({}), got {}", d.min_pixels, d.max_pixels));
  r.read("dir", d.dir);
  if (!d.dir.empty() && d.dataset == "shapes_vqa")
    r.fail("dir", "is not used by dataset shapes_vqa (it is generated, not read); remove it");
  r.read("image_size", d.image_size);
  if (d.image_size <= 0 || d.image_size % 28 != 0)
    r.fail("image_size", fmt::format("must be a positive multiple of 28, got {}", d.image_size));
  r.read("hflip", d.hflip);
  if (d.hflip && d.dataset != "fashion_mnist")
    r.fail(
        "hflip",
        d.dataset == "shapes_vqa"
            ? std::string(
                  "shapes_vqa asks which side a shape is on: a mirrored image would contradict its answers")
            : fmt::format("is only available for dataset fashion_mnist, not {}", d.dataset));
  r.read("shift", d.shift);
  r.at_least("shift", d.shift, int64_t{0});
  if (d.shift > 0 && d.dataset != "fashion_mnist")
    r.fail("shift", d.dataset == "shapes_vqa"
                        ? std::string("shapes_vqa asks which quadrant a shape is in: a moved image could "
                                      "carry a shape across the boundary and contradict its answers")
                        : fmt::format("is only available for dataset fashion_mnist, not {}", d.dataset));
  if (d.shift * 2 >= d.image_size)
    r.fail("shift",
           fmt::format("must be less than half of data.image_size ({}), got {}", d.image_size, d.shift));
  r.read("eval_samples", d.eval_samples);
  r.at_least("eval_samples", d.eval_samples, int64_t{1});
  r.read("max_seq_len", d.max_seq_len);
  r.at_least("max_seq_len", d.max_seq_len, int64_t{1});
  r.read("overlong", d.overlong);
  r.one_of("overlong", d.overlong, {"drop", "truncate", "error"});
  r.read("packing", d.packing);
  r.read("num_workers", d.num_workers);
  r.at_least("num_workers", d.num_workers, int64_t{0});
  r.read("prefetch", d.prefetch);
  r.at_least("prefetch", d.prefetch, int64_t{1});
  return d;
}

ParallelSection read_parallel(const YamlValue* section, const std::string& source) {
  const SectionReader r(section, "parallel",
                        {"tp", "pp", "cp", "ep", "dp", "sequence_parallel", "vision_tp", "zero", "timeout_s",
                         "bucket_mb", "overlap_grad_reduce", "fsdp_plan"},
                        source);
  ParallelSection p;
  for (auto [key, field] :
       {std::pair<const char*, int64_t*>{"tp", &p.tp}, {"pp", &p.pp}, {"cp", &p.cp}, {"ep", &p.ep}}) {
    r.read(key, *field);
    r.at_least(key, *field, int64_t{1});
  }
  if (const YamlValue* dp = r.get("dp")) {
    if (dp->kind == YamlValue::Kind::Scalar && dp->scalar == "auto") {
      p.dp = 0;
    } else {
      if (dp->kind != YamlValue::Kind::Scalar || !dp->plain || !looks_like_integer(dp->scalar))
        r.fail("dp", fmt::format("expected an integer >= 1 or auto, got {}", describe(*dp)));
      p.dp = as_integer(*dp, r.key_of("dp"));
      if (p.dp < 1) r.fail("dp", fmt::format("must be >= 1 or auto, got {}", p.dp));
    }
  }
  r.read("sequence_parallel", p.sequence_parallel);
  r.read("vision_tp", p.vision_tp);
  if (p.vision_tp != 0 && p.vision_tp != 1 && p.vision_tp != p.tp)
    r.fail("vision_tp", fmt::format("must be 1 (the vision tower whole on every tensor-parallel rank) or tp "
                                    "({}), or 0 for the same as tp; got {}",
                                    p.tp, p.vision_tp));
  r.read("zero", p.zero);
  if (p.zero != 0 && p.zero != 1 && p.zero != 3)
    r.fail("zero", fmt::format("{} is not one of 0, 1, 3", p.zero));
  r.read("timeout_s", p.timeout_s);
  r.at_least("timeout_s", p.timeout_s, int64_t{1});
  r.read("bucket_mb", p.bucket_mb);
  r.at_least("bucket_mb", p.bucket_mb, int64_t{1});
  r.read("overlap_grad_reduce", p.overlap_grad_reduce);
  // The all-reduce buckets are plain data parallelism's: ZeRO-1 reduce-scatters once after backward
  // and FSDP per unit, so a setting of theirs would be ignored.
  const ParallelSection defaults;
  if (p.zero != 0 && p.bucket_mb != defaults.bucket_mb)
    r.fail("bucket_mb", fmt::format("sizes the all-reduce buckets of zero=0; zero={} reduce-scatters "
                                    "without them (remove it)",
                                    p.zero));
  if (p.zero != 0 && p.overlap_grad_reduce != defaults.overlap_grad_reduce)
    r.fail("overlap_grad_reduce", fmt::format("applies to the all-reduce buckets of zero=0; zero={} has none "
                                              "(remove it)",
                                              p.zero));
  r.read("fsdp_plan", p.fsdp_plan);
  for (size_t i = 0; i < p.fsdp_plan.size(); ++i)
    if (p.fsdp_plan[i].empty()) r.fail("fsdp_plan", fmt::format("entry {} is an empty module path", i));
  if (!p.fsdp_plan.empty() && p.zero != 3)
    r.fail("fsdp_plan", fmt::format("is used only with parallel.zero=3 (FSDP); zero is {}", p.zero));
  return p;
}

FeaturesSection read_features(const YamlValue* section, const std::string& source) {
  const SectionReader r(section, "features", {"recompute", "fused_kernels"}, source);
  FeaturesSection f;
  r.read("recompute", f.recompute);
  r.read("fused_kernels", f.fused_kernels);
  r.one_of("recompute", f.recompute, {"none"});
  return f;
}

TrainingSection read_training(const YamlValue* section, const std::string& source) {
  const SectionReader r(
      section, "training",
      {"steps",        "global_batch_size", "micro_batch_size", "lr",        "min_lr",     "warmup_steps",
       "weight_decay", "adam_beta1",        "adam_beta2",       "adam_eps",  "clip_grad",  "precision",
       "seed",         "output_dir",        "save_every",       "keep_last", "eval_every", "resume",
       "threads",      "peak_tflops",       "exit_interval"},
      source);
  TrainingSection t;
  if (!r.get("steps")) r.missing("steps", "the number of optimizer steps, an integer > 0");
  r.read("steps", t.steps);
  r.at_least("steps", t.steps, int64_t{1});
  r.read("global_batch_size", t.global_batch_size);
  r.at_least("global_batch_size", t.global_batch_size, int64_t{1});
  r.read("micro_batch_size", t.micro_batch_size);
  r.at_least("micro_batch_size", t.micro_batch_size, int64_t{1});
  r.read("lr", t.lr);
  r.above("lr", t.lr, 0.0);
  r.read("min_lr", t.min_lr);
  r.at_least("min_lr", t.min_lr, 0.0);
  if (t.min_lr > t.lr) r.fail("min_lr", fmt::format("must be <= training.lr ({}), got {}", t.lr, t.min_lr));
  r.read("warmup_steps", t.warmup_steps);
  r.at_least("warmup_steps", t.warmup_steps, int64_t{0});
  r.read("weight_decay", t.weight_decay);
  r.at_least("weight_decay", t.weight_decay, 0.0);
  r.read("adam_beta1", t.adam_beta1);
  r.in_unit_interval("adam_beta1", t.adam_beta1);
  r.read("adam_beta2", t.adam_beta2);
  r.in_unit_interval("adam_beta2", t.adam_beta2);
  r.read("adam_eps", t.adam_eps);
  r.above("adam_eps", t.adam_eps, 0.0);
  r.read("clip_grad", t.clip_grad);
  r.at_least("clip_grad", t.clip_grad, 0.0);
  r.read("precision", t.precision);
  r.one_of("precision", t.precision, {"fp32", "bf16"});
  r.read("seed", t.seed);
  r.at_least("seed", t.seed, int64_t{0});
  r.read("output_dir", t.output_dir);
  r.not_empty("output_dir", t.output_dir, "a directory for checkpoints and logs");
  r.read("save_every", t.save_every);
  r.at_least("save_every", t.save_every, int64_t{0});
  r.read("keep_last", t.keep_last);
  r.at_least("keep_last", t.keep_last, int64_t{1});
  r.read("eval_every", t.eval_every);
  r.at_least("eval_every", t.eval_every, int64_t{0});
  r.read("resume", t.resume);
  r.not_empty("resume", t.resume, "auto, none or a checkpoint directory");
  r.read("threads", t.threads);
  r.at_least("threads", t.threads, int64_t{0});
  r.read("peak_tflops", t.peak_tflops);
  r.at_least("peak_tflops", t.peak_tflops, 0.0);
  r.read("exit_interval", t.exit_interval);
  r.at_least("exit_interval", t.exit_interval, int64_t{0});
  return t;
}

ToolsSection read_tools(const YamlValue* section, const std::string& source) {
  const SectionReader r(section, "tools", {"log_every", "log_level", "progress_bar", "dump_gradients"},
                        source);
  ToolsSection t;
  r.read("log_every", t.log_every);
  r.at_least("log_every", t.log_every, int64_t{1});
  r.read("log_level", t.log_level);
  r.one_of("log_level", t.log_level, {"trace", "debug", "info", "warn", "error"});
  r.read("progress_bar", t.progress_bar);
  r.read("dump_gradients", t.dump_gradients);
  r.at_least("dump_gradients", t.dump_gradients, int64_t{0});
  return t;
}

}  // namespace

JobConfig parse_config(const std::string& yaml_text, const std::string& source,
                       const std::vector<std::string>& overrides) {
  static const std::vector<std::string> kSections = {"model",    "data",     "parallel",
                                                     "features", "training", "tools"};
  YamlValue root = parse_yaml(yaml_text, source);
  if (root.kind != YamlValue::Kind::Null && root.kind != YamlValue::Kind::Mapping)
    throw ConfigError(fmt::format("{}: expected a mapping of sections ({}), got {}", source,
                                  join_list(kSections), describe(root)));
  for (const auto& assignment : overrides) apply_override(root, assignment);
  for (const auto& [name, value] : root.entries) {
    if (std::find(kSections.begin(), kSections.end(), name) == kSections.end())
      throw ConfigError(fmt::format("{}: unknown section '{}' (valid sections: {}{})", value.source, name,
                                    join_list(kSections), suggestion(name, kSections)));
  }

  JobConfig config;
  config.source = source;
  config.model = read_model(root.find("model"), source);
  config.data = read_data(root.find("data"), source);
  config.parallel = read_parallel(root.find("parallel"), source);
  config.features = read_features(root.find("features"), source);
  config.training = read_training(root.find("training"), source);
  config.tools = read_tools(root.find("tools"), source);
  return config;
}

JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw ConfigError(fmt::format("{}: cannot open the config file", path));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw ConfigError(fmt::format("{}: cannot read the config file", path));
  return parse_config(text.str(), path, overrides);
}

bool operator==(const ModelSection& a, const ModelSection& b) {
  return a.family == b.family && a.hf_config_path == b.hf_config_path && a.hf_config == b.hf_config &&
         a.init_from == b.init_from && a.freeze == b.freeze;
}
bool operator==(const DatasetFile& a, const DatasetFile& b) {
  return a.path == b.path && a.root == b.root && a.weight == b.weight && a.fields == b.fields;
}
bool operator==(const DataSection& a, const DataSection& b) {
  return a.dataset == b.dataset && a.tokenizer == b.tokenizer && a.datasets == b.datasets &&
         a.eval_datasets == b.eval_datasets && a.train_on_prompt == b.train_on_prompt &&
         a.min_pixels == b.min_pixels && a.max_pixels == b.max_pixels && a.dir == b.dir &&
         a.image_size == b.image_size && a.eval_samples == b.eval_samples && a.max_seq_len == b.max_seq_len &&
         a.overlong == b.overlong && a.packing == b.packing && a.num_workers == b.num_workers &&
         a.prefetch == b.prefetch && a.hflip == b.hflip && a.shift == b.shift;
}
bool operator==(const ParallelSection& a, const ParallelSection& b) {
  return a.tp == b.tp && a.pp == b.pp && a.cp == b.cp && a.ep == b.ep && a.dp == b.dp &&
         a.sequence_parallel == b.sequence_parallel && a.vision_tp == b.vision_tp && a.zero == b.zero &&
         a.timeout_s == b.timeout_s && a.bucket_mb == b.bucket_mb &&
         a.overlap_grad_reduce == b.overlap_grad_reduce && a.fsdp_plan == b.fsdp_plan;
}
bool operator==(const FeaturesSection& a, const FeaturesSection& b) {
  return a.recompute == b.recompute && a.fused_kernels == b.fused_kernels;
}
bool operator==(const TrainingSection& a, const TrainingSection& b) {
  return a.steps == b.steps && a.global_batch_size == b.global_batch_size &&
         a.micro_batch_size == b.micro_batch_size && a.lr == b.lr && a.min_lr == b.min_lr &&
         a.warmup_steps == b.warmup_steps && a.weight_decay == b.weight_decay &&
         a.adam_beta1 == b.adam_beta1 && a.adam_beta2 == b.adam_beta2 && a.adam_eps == b.adam_eps &&
         a.clip_grad == b.clip_grad && a.precision == b.precision && a.seed == b.seed &&
         a.output_dir == b.output_dir && a.save_every == b.save_every && a.keep_last == b.keep_last &&
         a.eval_every == b.eval_every && a.resume == b.resume && a.threads == b.threads &&
         a.peak_tflops == b.peak_tflops && a.exit_interval == b.exit_interval;
}
bool operator==(const ToolsSection& a, const ToolsSection& b) {
  return a.log_every == b.log_every && a.log_level == b.log_level && a.progress_bar == b.progress_bar &&
         a.dump_gradients == b.dump_gradients;
}
bool operator==(const JobConfig& a, const JobConfig& b) {
  return a.model == b.model && a.data == b.data && a.parallel == b.parallel && a.features == b.features &&
         a.training == b.training && a.tools == b.tools;
}

}  // namespace loom::config
