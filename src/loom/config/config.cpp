// Typing the YAML tree into JobConfig by the keys each section declares: every key known, every value
// typed and checked, then the rules between keys; and ==, by the same keys.
#include "loom/config/config.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "loom/config/foreign_keys.h"
#include "loom/config/yaml_tree.h"
#include "loom/util/errors.h"
#include "loom/util/filesystem.h"
#include "loom/util/spelling.h"

namespace loom::config {
namespace {

template <class T>
std::string join_list(const std::vector<T>& items) {
  std::string out;
  for (const auto& item : items) out += fmt::format("{}{}", out.empty() ? "" : ", ", item);
  return out;
}

// "; did you mean X?" for an unknown key `name` of the table `table` ("" for the top level): the Loom key
// of another trainer's name (foreign_keys.h), else the same key in another section (packing under
// training: data.packing), else a valid name a small typo away.
std::string unknown_key_hint(const std::string& name, const std::string& table,
                             const std::vector<std::string>& valid) {
  if (const std::string foreign = foreign_key_hint(name); !foreign.empty()) return "; " + foreign;
  for (const auto& [path, keys] : declared_keys())
    if (path != table && path.find('.') == std::string::npos &&
        std::find(keys.begin(), keys.end(), name) != keys.end())
      return fmt::format("; did you mean {}.{}?", path, name);
  return did_you_mean(name, valid);
}

// One mapping of the job (a section, or an entry of a list of them): refuses keys it does not know.
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
                                      key_of(key), name_, join_list(valid_),
                                      unknown_key_hint(key, name_, valid_)));
    }
  }

  const YamlValue* get(const std::string& key) const { return section_ ? section_->find(key) : nullptr; }
  std::string key_of(const std::string& key) const { return name_ + "." + key; }
  const std::string& document_source() const { return document_source_; }

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const YamlValue* value = get(key);
    throw ConfigError(locate(value ? value->source : document_source_, key_of(key)) + ": " + what);
  }
  // The same, naming the key by its field.
  template <class T, class S>
  [[noreturn]] void fail(T S::*field, const std::string& what) const {
    fail(key::name_of(field), what);
  }
  [[noreturn]] void missing(const std::string& key, const std::string& hint) const {
    throw ConfigError(fmt::format("{}: missing required key '{}' ({})", document_source_, key_of(key), hint));
  }

 private:
  const YamlValue* section_ = nullptr;
  std::string name_;
  std::vector<std::string> valid_;
  std::string document_source_;
};

// Reads section S; `out` starts as given (what is not a key but decides which keys are read).
template <class S>
S read_section(const YamlValue* section, const std::string& name, const std::string& source, S out = S{});

template <class F>
struct FieldType {
  using type = void;
};
template <class T, class S>
struct FieldType<T S::*> {
  using type = T;
};

// "{path: ..., root: ..., fields: {...}}": how a mapping of S's keys is written, for messages.
template <class S>
struct MappingShape {
  std::string text;
  template <class F, class... A>
  void operator()(const char* name, const F&, const A&...) {
    using T = typename FieldType<F>::type;
    const bool mapping = key::is_section<T> || std::is_same_v<T, std::map<std::string, std::string>>;
    text += fmt::format("{}{}: {}", text.empty() ? "" : ", ", name, mapping ? "{...}" : "...");
  }
};

template <class... A>
constexpr bool has_read_by = (std::is_same_v<A, ReadBy> || ...);

// Why a data key the dataset does not read is refused; fashion_mnist's keys are checked by value
// (check_rules), since shapes_vqa's job.yaml files have held them switched off.
void refuse_unread(const SectionReader& r, const DataSection& d, const char* name, ReadBy readers) {
  using S = DataSection;
  switch (readers) {
    case ReadBy::messages:
      r.fail(name, fmt::format("is only used by dataset messages, not {}; remove it", d.dataset));
    case ReadBy::files:
      r.fail(name,
             fmt::format("is only used by datasets messages and videos (the user's files), not {}; remove it",
                         d.dataset));
    case ReadBy::built_in:
      if (d.dataset == "videos")
        r.fail(name, fmt::format("is not used by dataset videos (its files are listed in {}); remove it",
                                 r.key_of(key::name_of(&S::datasets))));
      r.fail(name, fmt::format("is not used by dataset messages (images are sized by {} and {}); remove it",
                               key::name_of(&S::min_pixels), key::name_of(&S::max_pixels)));
    case ReadBy::built_in_images:
      if (d.reads(ReadBy::video))
        r.fail(name, fmt::format("is not used by dataset {} (its clips are sized by {}); remove it",
                                 d.dataset, r.key_of(key::name_of(&S::video_size))));
      r.fail(name, fmt::format("is not used by dataset messages (images are sized by {} and {}); remove it",
                               key::name_of(&S::min_pixels), key::name_of(&S::max_pixels)));
    case ReadBy::video:
      r.fail(name,
             fmt::format("is only used by the video datasets moving_fashion and videos, not {}; remove it",
                         d.dataset));
    case ReadBy::videos:
      r.fail(name, fmt::format("is only used by dataset videos, not {}; remove it", d.dataset));

    default:
      return;
  }
}

void refuse_unread(const SectionReader& r, const ModelSection& m, const char* name, ReadBy) {
  r.fail(name,
         fmt::format("is only used by task flow_matching (the denoiser's frozen helpers), not {}; remove it",
                     m.task));
}

void refuse_unread(const SectionReader& r, const TrainingSection& t, const char* name, ReadBy readers) {
  r.fail(name, fmt::format("is only used by task {}, not {}; remove it",
                           readers == ReadBy::vae             ? "vae"
                           : readers == ReadBy::flow_matching ? "flow_matching"
                                                              : "flow_matching or vae",
                           t.task));
}

// Reads the keys S declares from one mapping into `section`: for each key in order, refused if the
// section does not read it, typed, then required and checked as its attributes say.
template <class S>
class KeyReader {
 public:
  KeyReader(const SectionReader& r, S& section) : r_(r), section_(section) {}

  template <class T, class... A>
  void operator()(const char* name, T S::*field, const A&... attributes) {
    const YamlValue* value = r_.get(name);
    if constexpr (has_read_by<A...>) {
      const ReadBy readers = *key::find_attribute<ReadBy>(attributes...);
      if (!section_.reads(readers)) {
        if (!value) return;  // neither read nor given: nothing to check
        refuse_unread(r_, section_, name, readers);
      }
    }
    T& out = section_.*field;
    if (value) out = read_value<T>(*value, name, attributes...);
    const std::string hint = required_hint(attributes...);
    if (key::find_attribute<key::Required>(attributes...)) {
      bool absent = !value;
      if constexpr (key::is_section_list<T>) absent = absent || out.empty();
      if (absent) r_.missing(name, hint);
    }
    (check(name, out, attributes, hint), ...);
  }

  // A path, or the fields inline.
  template <class... A>
  void operator()(const char* name, const key::PathOrMapping<S>& field, const A&... attributes) {
    const YamlValue* value = r_.get(name);
    if constexpr (has_read_by<A...>) {
      const ReadBy readers = *key::find_attribute<ReadBy>(attributes...);
      if (!section_.reads(readers)) {
        if (!value) return;
        refuse_unread(r_, section_, name, readers);
      }
    }
    if (!value) {
      if (key::find_attribute<key::Required>(attributes...)) r_.missing(name, required_hint(attributes...));
      return;
    }
    if (value->kind == YamlValue::Kind::Scalar) {
      section_.*(field.path) = value->scalar;
      const std::string hint = required_hint(attributes...);
      (check(name, section_.*(field.path), attributes, hint), ...);
    } else if (value->kind == YamlValue::Kind::Mapping) {
      if (value->entries.empty()) r_.fail(name, "the inline mapping is empty");
      section_.*(field.mapping) = to_json(*value, r_.key_of(name));
    } else {
      r_.fail(name, fmt::format("expected {}, got {}", field.expected, describe(*value)));
    }
  }

 private:
  // What a required key's message says to give: its hint, else its one_of values.
  template <class... A>
  static std::string required_hint(const A&... attributes) {
    const key::Required* required = key::find_attribute<key::Required>(attributes...);
    if (required && required->hint) return required->hint;
    if (const auto* values = key::find_attribute<key::OneOf<std::string>>(attributes...))
      return "one of " + join_list(values->values);
    return "";
  }

  template <class T, class... A>
  T read_value(const YamlValue& value, const char* name, const A&... attributes) const {
    const std::string key = r_.key_of(name);
    if constexpr (std::is_same_v<T, int64_t>) {
      if constexpr ((std::is_same_v<A, key::IntegerOrAuto> || ...)) {
        if (value.kind == YamlValue::Kind::Scalar && value.scalar == "auto") return 0;
        if (value.kind != YamlValue::Kind::Scalar || !value.plain || !looks_like_integer(value.scalar))
          r_.fail(name, fmt::format("expected an integer >= 1 or auto, got {}", describe(value)));
        const int64_t n = as_integer(value, key);
        if (n < 1) r_.fail(name, fmt::format("must be >= 1 or auto, got {}", n));
        return n;
      } else {
        return as_integer(value, key);
      }
    } else if constexpr (std::is_same_v<T, double>) {
      return as_double(value, key);
    } else if constexpr (std::is_same_v<T, bool>) {
      return as_bool(value, key);
    } else if constexpr (std::is_same_v<T, std::string> || std::is_same_v<T, std::optional<std::string>>) {
      return as_string(value, key);
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      return as_string_list(value, key);
    } else if constexpr (std::is_same_v<T, std::map<std::string, std::vector<int64_t>>>) {
      // A mapping of integer lists under any names (the model checks them: pipeline towers).
      if (value.kind == YamlValue::Kind::Null) return {};
      if (value.kind != YamlValue::Kind::Mapping)
        fail_at(value, key,
                fmt::format("expected a mapping of integer lists such as {{a: [1, 2]}}, got {}",
                            describe(value)));
      T out;
      for (const auto& [entry, list] : value.entries) {
        const std::string entry_key = key + "." + entry;
        if (list.kind != YamlValue::Kind::Sequence)
          fail_at(list, entry_key,
                  fmt::format("expected a list of integers such as [1, 2], got {}", describe(list)));
        std::vector<int64_t>& numbers = out[entry];
        for (size_t i = 0; i < list.items.size(); ++i)
          numbers.push_back(as_integer(list.items[i], fmt::format("{}[{}]", entry_key, i)));
      }
      return out;
    } else if constexpr (std::is_same_v<T, std::map<std::string, std::string>>) {
      // A mapping of strings under the names the key allows.
      static_assert((std::is_same_v<A, key::Names> || ...), "a mapping key needs names(...)");
      const key::Names* names = key::find_attribute<key::Names>(attributes...);
      const SectionReader entries(&value, key, names->valid, r_.document_source());
      const key::NotEmpty* not_empty = key::find_attribute<key::NotEmpty>(attributes...);
      T out;
      for (const auto& entry : names->valid) {
        if (const YamlValue* v = entries.get(entry)) {
          std::string text = as_string(*v, entries.key_of(entry));
          if (not_empty && text.empty())
            entries.fail(entry,
                         fmt::format("must not be empty ({})", not_empty->hint ? not_empty->hint : ""));
          out[entry] = std::move(text);
        }
      }
      return out;
    } else if constexpr (key::is_section_list<T>) {
      using Entry = typename T::value_type;
      T out;
      if (value.kind == YamlValue::Kind::Null) return out;
      if (value.kind != YamlValue::Kind::Sequence) {
        MappingShape<Entry> shape;
        Entry::keys(shape);
        fail_at(value, key,
                fmt::format("expected a list of {{{}}} entries, got {}", shape.text, describe(value)));
      }
      for (size_t i = 0; i < value.items.size(); ++i)
        out.push_back(
            read_section<Entry>(&value.items[i], fmt::format("{}[{}]", key, i), r_.document_source()));
      return out;
    } else {
      static_assert(sizeof(T) == 0, "a config field of a type keys cannot read");
    }
  }

  // The checks a key's attributes name; attributes that are no check do nothing here.
  template <class T, class U>
  void check(const char* name, const T& value, const key::AtLeast<U>& a, const std::string&) const {
    if (value < a.min) r_.fail(name, fmt::format("must be >= {}, got {}", a.min, value));
  }
  template <class T, class U>
  void check(const char* name, const T& value, const key::AtMost<U>& a, const std::string&) const {
    if (value > a.max) r_.fail(name, fmt::format("must be <= {}, got {}", a.max, value));
  }
  template <class T, class U>
  void check(const char* name, const T& value, const key::Above<U>& a, const std::string&) const {
    if (!(value > a.bound)) r_.fail(name, fmt::format("must be > {}, got {}", a.bound, value));
  }
  template <class T>
  void check(const char* name, const T& value, key::InUnitInterval, const std::string&) const {
    static_assert(std::is_floating_point_v<T>, "in_unit_interval() is for numbers");
    if (value < 0.0 || value >= 1.0) r_.fail(name, fmt::format("must be in [0, 1), got {}", value));
  }
  template <class T, class U>
  void check(const char* name, const T& value, const key::OneOf<U>& a, const std::string&) const {
    if (std::find(a.values.begin(), a.values.end(), value) != a.values.end()) return;
    if constexpr (std::is_same_v<U, std::string>)
      r_.fail(name, fmt::format("'{}' is not one of {}", value, join_list(a.values)));
    else
      r_.fail(name, fmt::format("{} is not one of {}", value, join_list(a.values)));
  }
  void check(const char* name, const std::string& value, key::NotEmpty a,
             const std::string& required_hint) const {
    if (value.empty())
      r_.fail(name, fmt::format("must not be empty ({})", a.hint ? std::string(a.hint) : required_hint));
  }
  void check(const char* name, const std::vector<std::string>& value, key::NoEmptyEntry a,
             const std::string&) const {
    for (size_t i = 0; i < value.size(); ++i)
      if (value[i].empty()) r_.fail(name, fmt::format("entry {} is an empty {}", i, a.what));
  }
  template <class T, class A>
  void check(const char*, const T&, const A&, const std::string&) const {}

  const SectionReader& r_;
  S& section_;
};

// The rules between keys, after every key of the section is read; sections without any take this.
template <class S>
void check_rules(const SectionReader&, const S&) {}

void check_rules(const SectionReader& r, const ModelSection& m) {
  if (m.hf_config_path.empty() && m.hf_config.is_null() && m.init_from.empty())
    r.missing("hf_config",
              "a path to a HF config.json, a published model's name (as loom shapes lists them), or its "
              "fields as an "
              "inline mapping; it may be left out when model.init_from names a model directory");
}

void check_rules(const SectionReader& r, const DatasetFile& f) {
  using S = DatasetFile;
  if (f.path.empty() && f.name.empty())
    r.missing(key::name_of(&S::path),
              "the conversation file, a JSON array or JSON lines; or name, a dataset of data.dataset_info");
  if (!f.path.empty() && !f.name.empty())
    r.fail(&S::name, fmt::format("give it or {}, not both ({} is {})", r.key_of(key::name_of(&S::path)),
                                 r.key_of(key::name_of(&S::path)), f.path));
}

void check_rules(const SectionReader& r, const DataSection& d) {
  using S = DataSection;
  for (const auto* files : {&d.datasets, &d.eval_datasets})
    for (size_t i = 0; i < files->size(); ++i) {
      const DatasetFile& file = (*files)[i];
      const std::string entry = fmt::format(
          "{}[{}]", r.key_of(key::name_of(files == &d.datasets ? &S::datasets : &S::eval_datasets)), i);
      if (d.dataset == "videos" && (!file.name.empty() || file.format != "auto"))
        r.fail(
            files == &d.datasets ? &S::datasets : &S::eval_datasets,
            fmt::format("entry {}: name and format are read by dataset messages only; a video dataset's "
                        "samples are {{\"video\" or \"image\": PATH, \"caption\": TEXT}} in a file at path",
                        i));
      if (!file.name.empty() && d.dataset_info.empty())
        r.missing(key::name_of(&S::dataset_info),
                  fmt::format("the LLaMA-Factory dataset_info.json that {}.name '{}' is looked up in", entry,
                              file.name));
    }
  if (d.max_pixels > 0 && d.max_pixels < d.min_pixels)
    r.fail(&S::max_pixels, fmt::format("must be >= {} ({}), got {}", key::name_of(&S::min_pixels),
                                       d.min_pixels, d.max_pixels));
  if (d.video_max_pixels > 0 && d.video_max_pixels < d.video_min_pixels)
    r.fail(&S::video_max_pixels, fmt::format("must be >= {} ({}), got {}", key::name_of(&S::video_min_pixels),
                                             d.video_min_pixels, d.video_max_pixels));
  if (!d.dir.empty() && d.dataset == "shapes_vqa")
    r.fail(&S::dir, "is not used by dataset shapes_vqa (it is generated, not read); remove it");
  if (d.reads(ReadBy::built_in_images) && (d.image_size <= 0 || d.image_size % 28 != 0))
    r.fail(&S::image_size, fmt::format("must be a positive multiple of 28, got {}", d.image_size));
  if (d.hflip && !d.reads(ReadBy::fashion_mnist))
    r.fail(
        &S::hflip,
        d.dataset == "shapes_vqa"
            ? std::string(
                  "shapes_vqa asks which side a shape is on: a mirrored image would contradict its answers")
            : fmt::format("is only available for dataset fashion_mnist, not {}", d.dataset));
  if (d.shift > 0 && !d.reads(ReadBy::fashion_mnist))
    r.fail(&S::shift, d.dataset == "shapes_vqa"
                          ? std::string("shapes_vqa asks which quadrant a shape is in: a moved image could "
                                        "carry a shape across the boundary and contradict its answers")
                          : fmt::format("is only available for dataset fashion_mnist, not {}", d.dataset));
  if (d.reads(ReadBy::fashion_mnist) && d.shift * 2 >= d.image_size)
    r.fail(&S::shift, fmt::format("must be less than half of {} ({}), got {}",
                                  r.key_of(key::name_of(&S::image_size)), d.image_size, d.shift));
}

void check_rules(const SectionReader& r, const ParallelSection& p) {
  using S = ParallelSection;
  if (p.vision_tp != 0 && p.vision_tp != 1 && p.vision_tp != p.tp)
    r.fail(&S::vision_tp,
           fmt::format("must be 1 (the vision tower whole on every tensor-parallel rank) or tp "
                       "({}), or 0 for the same as tp; got {}",
                       p.tp, p.vision_tp));
  // The all-reduce buckets are plain data parallelism's: ZeRO-1 reduce-scatters once after backward
  // and FSDP per unit, so a setting of theirs would be ignored.
  const ParallelSection defaults;
  if (p.zero != 0 && p.bucket_mb != defaults.bucket_mb)
    r.fail(&S::bucket_mb, fmt::format("sizes the all-reduce buckets of zero=0; zero={} reduce-scatters "
                                      "without them (remove it)",
                                      p.zero));
  if (p.zero != 0 && p.overlap_grad_reduce != defaults.overlap_grad_reduce)
    r.fail(&S::overlap_grad_reduce,
           fmt::format("applies to the all-reduce buckets of zero=0; zero={} has none "
                       "(remove it)",
                       p.zero));
  if (!p.fsdp_plan.empty() && p.zero != 3)
    r.fail(&S::fsdp_plan, fmt::format("is used only with {}=3 (FSDP); zero is {}",
                                      r.key_of(key::name_of(&S::zero)), p.zero));
}

void check_rules(const SectionReader& r, const FeaturesSection& f) {
  using S = FeaturesSection;
  if (f.recompute_layers != 0 && f.recompute == "none")
    r.fail(&S::recompute_layers, fmt::format("is used only with {} full or selective; it is none",
                                             r.key_of(key::name_of(&S::recompute))));
  if (f.offload && f.recompute != "full")
    r.fail(&S::offload,
           fmt::format("moves out the inputs that full recompute keeps; {} is {} (set it to full)",
                       r.key_of(key::name_of(&S::recompute)), f.recompute));
}

void check_rules(const SectionReader& r, const TrainingSection& t) {
  using S = TrainingSection;
#ifndef LOOM_TORCH_CUDA
  if (t.device == "cuda")
    r.fail(&S::device,
           "cuda needs Loom built against a CUDA libtorch; this build's libtorch is CPU-only (README: "
           "\"Training on GPUs\")");
#endif
  if (t.allow_tf32 && t.device != "cuda")
    r.fail(&S::allow_tf32, fmt::format("applies to CUDA's matrix products; {} is {} (remove it)",
                                       r.key_of(key::name_of(&S::device)), t.device));
  // steps: 0 beside epochs reads back a job.yaml written before the steps were resolved.
  if (t.steps == 0 && t.epochs == 0 && r.get("steps")) r.fail(&S::steps, "must be >= 1, got 0");
  if (t.steps == 0 && t.epochs == 0)
    r.missing("steps",
              "the number of optimizer steps, an integer > 0; or training.epochs, the passes over the "
              "training data");
  if (t.steps > 0 && t.epochs > 0)
    r.fail(&S::epochs, fmt::format("give it or {}, not both ({} is {})", r.key_of(key::name_of(&S::steps)),
                                   r.key_of(key::name_of(&S::steps)), t.steps));
  if (t.min_lr > t.lr)
    r.fail(&S::min_lr,
           fmt::format("must be <= {} ({}), got {}", r.key_of(key::name_of(&S::lr)), t.lr, t.min_lr));
}

template <class S>
S read_section(const YamlValue* section, const std::string& name, const std::string& source, S out) {
  const SectionReader r(section, name, key::names_of<S>(), source);
  KeyReader<S> reader(r, out);
  S::keys(reader);
  check_rules(r, out);
  return out;
}

// Reads every section JobConfig declares from the document's root mapping.
struct SectionsReader {
  const YamlValue& root;
  const std::string& source;
  JobConfig& config;
  template <class S>
  void operator()(const char* name, S JobConfig::*section) {
    S initial;
    if constexpr (std::is_same_v<S, ModelSection>) initial.task = training_task();
    config.*section = read_section<S>(root.find(name), name, source, std::move(initial));
  }

  // training.task as the document gives it (its default when absent; the training section checks it).
  std::string training_task() const {
    const YamlValue* training = root.find("training");
    const YamlValue* task =
        training && training->kind == YamlValue::Kind::Mapping ? training->find("task") : nullptr;
    return task && task->kind == YamlValue::Kind::Scalar ? task->scalar : TrainingSection{}.task;
  }
};

// Whether two sections hold the same value under every key.
template <class S>
struct KeysEqual {
  const S& a;
  const S& b;
  bool equal = true;
  template <class T, class... A>
  void operator()(const char*, T S::*field, const A&...) {
    equal = equal && a.*field == b.*field;
  }
  template <class... A>
  void operator()(const char*, const key::PathOrMapping<S>& field, const A&...) {
    equal = equal && a.*(field.path) == b.*(field.path) && a.*(field.mapping) == b.*(field.mapping);
  }
};

template <class S>
bool keys_equal(const S& a, const S& b) {
  KeysEqual<S> compare{a, b};
  S::keys(compare);
  return compare.equal;
}

// The key tables below `prefix`: one per section, and per list of mappings in one.
template <class S>
struct TableLister {
  std::string prefix;
  std::vector<std::pair<std::string, std::vector<std::string>>>& tables;
  template <class F, class... A>
  void operator()(const char* name, const F&, const A&...) {
    using T = typename FieldType<F>::type;
    if constexpr (key::is_section<T>) {
      add<T>(name);
    } else if constexpr (key::is_section_list<T>) {
      add<typename T::value_type>(name);
    }
  }
  template <class Table>
  void add(const char* name) {
    const std::string path = prefix.empty() ? name : prefix + "." + name;
    tables.emplace_back(path, key::names_of<Table>());
    TableLister<Table> inner{path, tables};
    Table::keys(inner);
  }
};

}  // namespace

bool DataSection::reads(ReadBy datasets) const {
  switch (datasets) {
    case ReadBy::messages:
      return dataset == "messages";
    case ReadBy::files:
      return dataset == "messages" || dataset == "videos";
    case ReadBy::built_in:
      return dataset != "messages" && dataset != "videos";
    case ReadBy::built_in_images:
      return dataset == "shapes_vqa" || dataset == "fashion_mnist";
    case ReadBy::fashion_mnist:
      return dataset == "fashion_mnist";
    case ReadBy::video:
      return dataset == "moving_fashion" || dataset == "videos";
    case ReadBy::videos:
      return dataset == "videos";

    default:
      return false;
  }
}

JobConfig parse_config(const std::string& yaml_text, const std::string& source,
                       const std::vector<std::string>& overrides) {
  const std::vector<std::string> sections = key::names_of<JobConfig>();
  YamlValue root = parse_yaml(yaml_text, source);
  if (root.kind != YamlValue::Kind::Null && root.kind != YamlValue::Kind::Mapping)
    throw ConfigError(fmt::format("{}: expected a mapping of sections ({}), got {}", source,
                                  join_list(sections), describe(root)));
  for (const auto& assignment : overrides) apply_override(root, assignment);
  // Every unknown top-level name in one line: a flat file of another trainer's keys shows them all.
  std::vector<std::string> unknown;
  const YamlValue* first = nullptr;
  for (const auto& [name, value] : root.entries)
    if (std::find(sections.begin(), sections.end(), name) == sections.end()) {
      unknown.push_back(name);
      if (!first) first = &value;
    }
  if (unknown.size() == 1)
    throw ConfigError(fmt::format("{}: unknown section '{}' (valid sections: {}{})", first->source,
                                  unknown[0], join_list(sections),
                                  unknown_key_hint(unknown[0], "", sections)));
  if (!unknown.empty()) {
    std::vector<std::string> named;
    for (const std::string& name : unknown) {
      const std::string hint = unknown_key_hint(name, "", sections);
      named.push_back(hint.empty() ? fmt::format("'{}'", name)
                                   : fmt::format("'{}' ({})", name, hint.substr(2)));
    }
    throw ConfigError(
        fmt::format("{}: unknown sections {} (valid sections: {}; docs/config.md, \"Keys from "
                    "other trainers\")",
                    first->source, fmt::join(named, ", "), join_list(sections)));
  }

  JobConfig config;
  config.source = source;
  SectionsReader reader{root, source, config};
  JobConfig::keys(reader);
  return config;
}

JobConfig load_config(const std::string& path, const std::vector<std::string>& overrides) {
  std::ifstream file(path, std::ios::binary);
  if (!file) throw ConfigError(fmt::format("{}: cannot open the config file", path));
  // A directory opens as a stream too, and reads as an empty job.
  if (const std::string why = unreadable_file_reason(path); !why.empty())
    throw ConfigError(fmt::format("{}: cannot read the config file: it {}", path, why));
  std::ostringstream text;
  text << file.rdbuf();
  if (file.bad()) throw ConfigError(fmt::format("{}: cannot read the config file", path));
  return parse_config(text.str(), path, overrides);
}

std::vector<std::pair<std::string, std::vector<std::string>>> declared_keys() {
  std::vector<std::pair<std::string, std::vector<std::string>>> tables;
  TableLister<JobConfig> lister{"", tables};
  JobConfig::keys(lister);
  return tables;
}

bool operator==(const ModelSection& a, const ModelSection& b) { return keys_equal(a, b); }
bool operator==(const DatasetFile& a, const DatasetFile& b) { return keys_equal(a, b); }
bool operator==(const DataSection& a, const DataSection& b) { return keys_equal(a, b); }
bool operator==(const ParallelSection& a, const ParallelSection& b) { return keys_equal(a, b); }
bool operator==(const FeaturesSection& a, const FeaturesSection& b) { return keys_equal(a, b); }
bool operator==(const TrainingSection& a, const TrainingSection& b) { return keys_equal(a, b); }
bool operator==(const ToolsSection& a, const ToolsSection& b) { return keys_equal(a, b); }
bool operator==(const JobConfig& a, const JobConfig& b) { return keys_equal(a, b); }

}  // namespace loom::config
