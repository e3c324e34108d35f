// JobConfig -> YAML text with every key, readable and exact: parse_config reads it back to an equal config.
#include <fmt/format.h>

#include "loom/config/config.h"
#include "loom/config/yaml_tree.h"

namespace loom::config {
namespace {

// A string as YAML: bare when it plainly reads back as the same text, else double-quoted (JSON escaping
// is valid YAML).
std::string yaml_string(const std::string& s) {
  bool bare = !s.empty() && s != "null" && s != "Null" && s != "NULL" && s != "~";
  for (size_t i = 0; bare && i < s.size(); ++i) {
    const char c = s[i];
    const bool word = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
    bare = word || (i > 0 && (c == '.' || c == '/' || c == '-'));
  }
  return bare ? s : nlohmann::json(s).dump();
}

// A double that reads back as exactly the same double, and as a float: 1 -> 1.0, 1e-08 stays.
std::string yaml_double(double value) {
  std::string text = fmt::format("{}", value);
  if (looks_like_integer(text)) text += ".0";
  return text;
}

// JSON in YAML flow form with spaced separators; strings stay quoted so they read back as strings.
std::string flow_json(const nlohmann::json& value) {
  std::string out;
  if (value.is_array()) {
    for (const auto& item : value) out += (out.empty() ? "" : ", ") + flow_json(item);
    return "[" + out + "]";
  }
  if (value.is_object()) {
    for (const auto& [key, item] : value.items())
      out += (out.empty() ? "" : ", ") + nlohmann::json(key).dump() + ": " + flow_json(item);
    return "{" + out + "}";
  }
  return value.dump();
}

// A JSON object as an indented block mapping; nested non-empty objects nest as blocks too.
void emit_object(std::string& out, const nlohmann::json& object, int indent) {
  for (const auto& [key, item] : object.items()) {
    out += fmt::format("{:{}}{}:", "", indent, yaml_string(key));
    if (item.is_object() && !item.empty()) {
      out += "\n";
      emit_object(out, item, indent + 2);
    } else {
      out += " " + flow_json(item) + "\n";
    }
  }
}

// data.datasets / data.eval_datasets as a block list, one mapping per file.
std::string dataset_files(const std::vector<DatasetFile>& files) {
  if (files.empty()) return " []\n";
  std::string out = "\n";
  for (const DatasetFile& f : files) {
    out += fmt::format("    - path: {}\n      root: {}\n      weight: {}\n", yaml_string(f.path),
                       yaml_string(f.root), yaml_double(f.weight));
    std::string fields;
    for (const auto& [field, name] : f.fields)
      fields += fmt::format("{}{}: {}", fields.empty() ? "" : ", ", field, yaml_string(name));
    out += "      fields: {" + fields + "}\n";
  }
  return out;
}

}  // namespace

std::string to_yaml(const JobConfig& c) {
  std::string out;
  auto line = [&out](const std::string& key, const std::string& value) {
    out += fmt::format("  {}: {}\n", key, value);
  };
  auto integer = [](int64_t v) { return std::to_string(v); };
  auto boolean = [](bool v) { return std::string(v ? "true" : "false"); };

  out += "model:\n";
  line("family", yaml_string(c.model.family));
  if (!c.model.hf_config_path.empty() || c.model.hf_config.is_null()) {
    line("hf_config", yaml_string(c.model.hf_config_path));
  } else if (c.model.hf_config.is_object() && !c.model.hf_config.empty()) {
    out += "  hf_config:\n";
    emit_object(out, c.model.hf_config, 4);
  } else {
    line("hf_config", flow_json(c.model.hf_config));
  }
  line("init_from", yaml_string(c.model.init_from));
  std::string freeze;
  for (const auto& prefix : c.model.freeze) freeze += (freeze.empty() ? "" : ", ") + yaml_string(prefix);
  line("freeze", "[" + freeze + "]");

  out += "data:\n";
  line("dataset", yaml_string(c.data.dataset));
  if (c.data.dataset == "messages") {
    line("tokenizer", yaml_string(c.data.tokenizer));
    out += "  datasets:" + dataset_files(c.data.datasets);
    out += "  eval_datasets:" + dataset_files(c.data.eval_datasets);
    line("train_on_prompt", boolean(c.data.train_on_prompt));
    line("min_pixels", integer(c.data.min_pixels));
    line("max_pixels", integer(c.data.max_pixels));
  } else {
    line("dir", yaml_string(c.data.dir));
    line("image_size", integer(c.data.image_size));
    line("hflip", boolean(c.data.hflip));
    line("shift", integer(c.data.shift));
  }
  line("eval_samples", integer(c.data.eval_samples));
  line("max_seq_len", integer(c.data.max_seq_len));
  line("overlong", yaml_string(c.data.overlong));
  line("packing", boolean(c.data.packing));
  line("num_workers", integer(c.data.num_workers));
  line("prefetch", integer(c.data.prefetch));

  out += "parallel:\n";
  line("tp", integer(c.parallel.tp));
  line("pp", integer(c.parallel.pp));
  line("cp", integer(c.parallel.cp));
  line("ep", integer(c.parallel.ep));
  line("dp", c.parallel.dp == 0 ? "auto" : integer(c.parallel.dp));
  line("sequence_parallel", boolean(c.parallel.sequence_parallel));
  line("vision_tp", integer(c.parallel.vision_tp));
  line("zero", integer(c.parallel.zero));
  line("timeout_s", integer(c.parallel.timeout_s));
  line("bucket_mb", integer(c.parallel.bucket_mb));
  line("overlap_grad_reduce", boolean(c.parallel.overlap_grad_reduce));
  std::string plan;
  for (const auto& path : c.parallel.fsdp_plan) plan += (plan.empty() ? "" : ", ") + yaml_string(path);
  line("fsdp_plan", "[" + plan + "]");

  out += "features:\n";
  line("recompute", yaml_string(c.features.recompute));
  line("fused_kernels", boolean(c.features.fused_kernels));

  const TrainingSection& t = c.training;
  out += "training:\n";
  line("steps", integer(t.steps));
  line("global_batch_size", integer(t.global_batch_size));
  line("micro_batch_size", integer(t.micro_batch_size));
  line("lr", yaml_double(t.lr));
  line("min_lr", yaml_double(t.min_lr));
  line("warmup_steps", integer(t.warmup_steps));
  line("weight_decay", yaml_double(t.weight_decay));
  line("adam_beta1", yaml_double(t.adam_beta1));
  line("adam_beta2", yaml_double(t.adam_beta2));
  line("adam_eps", yaml_double(t.adam_eps));
  line("clip_grad", yaml_double(t.clip_grad));
  line("precision", yaml_string(t.precision));
  line("seed", integer(t.seed));
  line("output_dir", yaml_string(t.output_dir));
  line("save_every", integer(t.save_every));
  line("keep_last", integer(t.keep_last));
  line("eval_every", integer(t.eval_every));
  line("resume", yaml_string(t.resume));
  line("threads", integer(t.threads));
  line("peak_tflops", yaml_double(t.peak_tflops));
  line("exit_interval", std::to_string(t.exit_interval));

  out += "tools:\n";
  line("log_every", integer(c.tools.log_every));
  line("log_level", yaml_string(c.tools.log_level));
  line("progress_bar", boolean(c.tools.progress_bar));
  line("dump_gradients", integer(c.tools.dump_gradients));
  return out;
}

}  // namespace loom::config
