// The names users bring from other trainers' configs (HF Trainer's TrainingArguments, LLaMA-Factory's
// YAML), each with the Loom key that does its job and how its value converts, so an unknown key that
// is one of them gets "did you mean" with Loom's key rather than an edit-distance guess.
#pragma once
#include <string>
#include <vector>

namespace loom::config {

struct ForeignKey {
  const char* name;     // as the other trainer spells it, e.g. learning_rate
  const char* from;     // "HF Trainer" or "LLaMA-Factory"
  const char* key;      // Loom's key, e.g. training.lr (a key declared_keys() lists)
  const char* convert;  // how its value becomes Loom's, e.g. "the same value"
};

// Every foreign name Loom knows, in the order docs/config.md lists them.
const std::vector<ForeignKey>& foreign_keys();

// "did you mean training.lr? (HF Trainer's learning_rate: the same value)" for a foreign name, "" for
// any other.
std::string foreign_key_hint(const std::string& name);

}  // namespace loom::config
