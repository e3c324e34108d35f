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

SequenceChunks sequence_chunks(const TensorParallelGroup& tp, int64_t length) {
  SequenceChunks chunks;
  chunks.length = chunks.padded = length;
  if (!tp.sequence_parallel || tp.size() == 1) return chunks;
  chunks.split = true;
  chunks.padded = (length + tp.size() - 1) / tp.size() * tp.size();
  return chunks;
}

void pad_sequence_tables(const SequenceChunks& chunks, int64_t dim, at::Tensor& cos, at::Tensor& sin,
                         const std::vector<std::vector<int64_t>*>& segments) {
  if (!chunks.split || chunks.padded == chunks.length) return;
  const int64_t extra = chunks.padded - chunks.length;
  cos = pad_end(cos, dim, extra, 1.0);
  sin = pad_end(sin, dim, extra, 0.0);
  for (std::vector<int64_t>* cu : segments)
    if (!cu->empty()) cu->push_back(chunks.padded);
}

at::Tensor scatter_sequence(const TensorParallelGroup& tp, int64_t dim, const at::Tensor& x,
                            const SequenceChunks& chunks) {
  if (!chunks.split) return x;
  const at::Tensor padded =
      chunks.padded > chunks.length ? pad_end(x, dim, chunks.padded - chunks.length, 0.0) : x;
  return dist::scatter_to_region(padded, tp.comm, dim);
}

at::Tensor gather_sequence(const TensorParallelGroup& tp, int64_t dim, const at::Tensor& x,
                           const SequenceChunks& chunks) {
  if (!chunks.split) return x;
  return dist::gather_from_region(x, tp.comm, dim).narrow(dim, 0, chunks.length);
}

}  // namespace loom::parallel
