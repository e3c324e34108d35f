#include "loom/parallel/sequence.h"

#include "loom/dist/mappings.h"

namespace loom::parallel {
namespace {

at::Tensor pad_end(const at::Tensor& x, int64_t dim, int64_t extra, double value) {
  std::vector<int64_t> shape = x.sizes().vec();
  shape[static_cast<size_t>(dim)] = extra;
  return at::cat({x, at::full(shape, value, x.options())}, dim);
}

}  // namespace

SequenceChunks enter_sequence_parallel(const TensorParallelGroup& tp, int64_t dim, at::Tensor& x,
                                       at::Tensor& cos, at::Tensor& sin,
                                       const std::vector<std::vector<int64_t>*>& segments) {
  SequenceChunks chunks;
  if (!tp.sequence_parallel || tp.size() == 1) return chunks;
  chunks.split = true;
  chunks.length = x.size(dim);
  const int64_t padded = (chunks.length + tp.size() - 1) / tp.size() * tp.size();
  if (padded > chunks.length) {
    const int64_t extra = padded - chunks.length;
    x = pad_end(x, dim, extra, 0.0);
    cos = pad_end(cos, dim, extra, 1.0);
    sin = pad_end(sin, dim, extra, 0.0);
    for (std::vector<int64_t>* cu : segments)
      if (!cu->empty()) cu->push_back(padded);
  }
  x = dist::scatter_to_region(x, tp.comm, dim);
  return chunks;
}

at::Tensor leave_sequence_parallel(const TensorParallelGroup& tp, int64_t dim, const at::Tensor& x,
                                   const SequenceChunks& chunks) {
  if (!chunks.split) return x;
  return dist::gather_from_region(x, tp.comm, dim).narrow(dim, 0, chunks.length);
}

}  // namespace loom::parallel
