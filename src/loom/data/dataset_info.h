// LLaMA-Factory's dataset registry, dataset_info.json: a dataset named there read as it describes it.
#pragma once
#include <string>

#include "loom/data/conversation.h"

namespace loom::data {

// The dataset `name` of the registry at `info_path` as a file to read: its file_name (relative to
// the registry's directory, which is also the root its media paths are relative to, as in
// LLaMA-Factory), its formatting (alpaca when not given, openai read as messages) and the field
// names of its columns and tags. Every entry's keys are checked, so a typo anywhere in the registry
// is found. DataError naming the registry, the entry and the key for: a key LLaMA-Factory does not
// define, a name the registry does not hold, and an entry Loom cannot train on as supervised
// fine-tuning data (a dataset on a hub or behind a script, a folder or a file not JSON, preference
// or KTO data, num_samples).
DatasetSpec registry_dataset(const std::string& info_path, const std::string& name);

}  // namespace loom::data
