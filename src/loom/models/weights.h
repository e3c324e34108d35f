// Model parameters by name: deterministic initialisation, loading a HuggingFace-style model
// directory (config.json + safetensors) and saving one.
#pragma once
#include <ATen/ATen.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace loom::models {

// Initialises every parameter from (seed, parameter name), so the result does not depend on
// construction order or parallel layout: norm scales 1, biases 0, other weights N(0, std^2).
// A tensor-parallel rank draws the whole tensor and keeps its slice.
void init_parameters(torch::nn::Module& module, uint64_t seed, double std = 0.02);

// Copies every parameter from the safetensors of `model_dir` (model.safetensors or a sharded
// index), converting dtype. Missing or mis-shaped tensors are errors naming the tensor and file;
// tensors in the file that the model does not have are errors too, except `lm_head.weight`
// for a tied model. The file holds whole tensors; a tensor-parallel rank keeps its slice.
void load_parameters(torch::nn::Module& module, const std::string& model_dir);

// Where a parameter's whole tensor is in a checkpoint of another published layout: the file's tensor
// and, where that layout fuses several parameters into one (q, k and v), the rows [begin, end) of its
// first dimension that are this one (end 0: all of it).
struct FileTensor {
  std::string name;
  int64_t begin = 0, end = 0;
  // Instead of one tensor: the stack (along a new first dimension) of the concatenations (along their
  // first dimension) of these lists of the file's tensors, for a layout that keeps apart what the
  // parameter holds together (per-expert weights).
  std::vector<std::vector<std::string>> stacked;
  // Absent from the files: the parameter keeps the value it has.
  bool optional = false;
};
// load_parameters with each parameter read from where `locate` says (the same errors, naming the
// file's tensors): every tensor of the files must be read, but for a tied model's copy of its head.
void load_parameters(torch::nn::Module& module, const std::string& model_dir,
                     const std::function<FileTensor(const std::string& parameter)>& locate);
// The same, leaving the file's tensors that `skip` names unread (a checkpoint's parts the model does
// not have, such as multi-token-prediction weights); returns how many were left.
int64_t load_parameters(torch::nn::Module& module, const std::string& model_dir,
                        const std::function<FileTensor(const std::string& parameter)>& locate,
                        const std::function<bool(const std::string& tensor)>& skip);

// Parameter tensors in module order, with HuggingFace names (this rank's slices under tensor
// parallelism).
std::vector<std::pair<std::string, at::Tensor>> named_parameters(const torch::nn::Module& module);

// The same with every tensor-parallel slice gathered into its whole tensor, as a checkpoint
// holds it: a collective that every rank of each tensor-parallel group calls.
std::vector<std::pair<std::string, at::Tensor>> whole_named_parameters(const torch::nn::Module& module);

// Total number of elements over all parameters (those that train, when `trainable_only`), each
// counted whole: a tensor-parallel slice counts as the parameter it is a slice of, so every rank
// reports the model's count (works on shapes-only models).
int64_t parameter_count(const torch::nn::Module& module, bool trainable_only = false);

// A stable 64-bit seed derived from a base seed and a purpose string (FNV-1a).
uint64_t derive_seed(uint64_t seed, const std::string& purpose);

}  // namespace loom::models
