// The layout ZeRO-1 and FSDP share: named parameters laid end to end in one flat vector, padded to
// a multiple of the rank count, of which rank r owns the r-th equal slice. The shard holds this
// rank's slice of the parameters' values in fp32 (the master weights the optimizer updates) and of
// their summed gradient.
#pragma once
#include <ATen/ATen.h>

#include <string>
#include <vector>

namespace loom::parallel {

class FlatShard {
 public:
  // `params` (fp32 or bf16, any shapes; only their shapes are read if `copy_values` is false).
  // The master slice starts as this rank's part of the parameters' current values.
  FlatShard(std::vector<std::string> names, std::vector<at::Tensor> params, int64_t rank, int64_t ranks,
            bool copy_values = true);

  const std::vector<std::string>& names() const { return names_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  int64_t offset(size_t i) const { return offsets_[i]; }  // where parameter i starts in the flat vector
  int64_t numel() const { return numel_; }                // the parameters' elements, unpadded
  int64_t padded_numel() const { return slice_ * ranks_; }
  int64_t slice_numel() const { return slice_; }
  // The parameters' device, where the slices and flat vectors are made (the CPU when there are none).
  at::Device device() const { return params_.empty() ? at::Device(at::kCPU) : params_.front().device(); }
  int64_t rank() const { return rank_; }
  int64_t ranks() const { return ranks_; }

  // The elements of parameter i's flattened values that fall in this rank's slice: from
  // `in_param`, `length` of them, placed at `in_slice` (length 0: none).
  struct Overlap {
    int64_t in_param = 0, in_slice = 0, length = 0;
  };
  Overlap overlap(size_t i) const;

  // Writes this rank's slice of whole per-parameter values (shaped like the parameters, any float
  // dtype) into `slice` (fp32 [slice_numel()]). An undefined value leaves its part unchanged.
  void take_slice(const std::vector<at::Tensor>& values, at::Tensor& slice) const;
  // The whole flat vector (padded_numel(), `dtype`) of per-parameter values; zeros where a value is
  // undefined and in the padding.
  at::Tensor flatten(const std::vector<at::Tensor>& values, at::ScalarType dtype) const;
  // Parameter i's part of a whole flat vector, shaped like the parameter (a view).
  at::Tensor unflatten(const at::Tensor& flat, size_t i) const;

  at::Tensor master;  // fp32 [slice_numel()]: this rank's slice of the parameters' values
  at::Tensor grad;    // fp32 [slice_numel()]: this rank's slice of the summed gradient
  // Which parameters got a gradient on this rank since the last step (set by whoever fills `grad`):
  // a parameter no rank gave a gradient to is left alone by the step, as AdamW leaves a parameter
  // without a gradient.
  std::vector<bool> has_grad;

 private:
  std::vector<std::string> names_;
  std::vector<at::Tensor> params_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0, slice_ = 0, rank_ = 0, ranks_ = 1;
};

}  // namespace loom::parallel
