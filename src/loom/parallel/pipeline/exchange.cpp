#include "loom/parallel/pipeline/exchange.h"

#include <fmt/format.h>

#include <cstring>
#include <limits>
#include <sstream>

#include "loom/util/errors.h"
#include "loom/util/timer.h"

namespace loom::parallel::pipeline {
namespace {

// A header's bytes: "<name> <dtype> <needs grad> <rank> <size>...\n" per entry, then zeros.
constexpr int64_t kHeaderBytes = 4096;
// Tags per (micro-batch, stage, direction): the header and up to this many entries less one.
constexpr int64_t kParts = 64;
// Spare buffers kept for reuse, at most.
constexpr size_t kMaxSpare = 64;

std::string header_text(const core::Carry& carry) {
  std::string text;
  for (const auto& [name, t] : carry.tensors()) {
    text += fmt::format("{} {} {} {}", name, static_cast<int>(t.scalar_type()), t.requires_grad() ? 1 : 0,
                        t.dim());
    for (int64_t size : t.sizes()) text += fmt::format(" {}", size);
    text += "\n";
  }
  return text;
}

struct Entry {
  std::string name;
  at::ScalarType dtype;
  bool needs_grad;
  std::vector<int64_t> sizes;
};

std::vector<Entry> parse_header(const at::Tensor& bytes) {
  const char* data = reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>());
  std::istringstream in(std::string(data, strnlen(data, kHeaderBytes)));
  std::vector<Entry> entries;
  std::string name;
  while (in >> name) {
    int dtype = 0, needs_grad = 0;
    int64_t rank = 0;
    in >> dtype >> needs_grad >> rank;
    Entry e{name, static_cast<at::ScalarType>(dtype), needs_grad != 0, std::vector<int64_t>(rank)};
    for (auto& size : e.sizes) in >> size;
    if (!in) throw DistributedError("pipeline: a carry header that does not parse");
    entries.push_back(std::move(e));
  }
  return entries;
}

}  // namespace

struct CarryExchange::Header {
  at::Tensor bytes;
  std::unique_ptr<dist::PendingWork> work;
};

at::Tensor CarryExchange::take_buffer(at::IntArrayRef sizes, at::ScalarType dtype, at::Device device) {
  auto it = spare_.find({static_cast<int>(dtype), device.str(), sizes.vec()});
  if (it == spare_.end() || it->second.empty())
    return at::empty(sizes, at::TensorOptions().dtype(dtype).device(device));
  at::Tensor buffer = std::move(it->second.back());
  it->second.pop_back();
  --spare_count_;
  ++reused_;
  return buffer;
}

void CarryExchange::give_back(at::Tensor buffer) {
  // Only what nothing else holds (backward may have kept a gradient as a leaf's .grad).
  if (!buffer.defined() || buffer.use_count() != 1 || buffer.storage().use_count() != 1 ||
      spare_count_ >= kMaxSpare)
    return;
  spare_[{static_cast<int>(buffer.scalar_type()), buffer.device().str(), buffer.sizes().vec()}].push_back(
      std::move(buffer));
  ++spare_count_;
}

void CarryExchange::give_back(std::map<std::string, at::Tensor>& gradients) {
  for (auto& [name, grad] : gradients) give_back(std::move(grad));
  gradients.clear();
}

CarryExchange::CarryExchange(std::shared_ptr<dist::Comm> pipeline, int64_t global_stages, at::Device device)
    : comm_(std::move(pipeline)), global_stages_(global_stages), device_(device) {}

CarryExchange::~CarryExchange() = default;

int64_t CarryExchange::tag(int64_t micro_batch, int64_t stage, bool backward, int64_t part) const {
  const int64_t limit = std::numeric_limits<int32_t>::max() / (global_stages_ * 2 * kParts);
  if (micro_batch >= limit)
    throw DistributedError(fmt::format(
        "pipeline: micro-batch {} of a step is beyond the {} the tags can tell apart", micro_batch, limit));
  return ((micro_batch * global_stages_ + stage) * 2 + (backward ? 1 : 0)) * kParts + part;
}

void CarryExchange::send_forward(const core::Carry& carry, int64_t peer, int64_t micro_batch, int64_t stage) {
  if (static_cast<int64_t>(carry.tensors().size()) >= kParts)
    throw ModelError(
        fmt::format("pipeline: stage {}'s carry holds {} entries, more than the {} a message carries", stage,
                    carry.tensors().size(), kParts - 1));
  const std::string text = header_text(carry);
  if (static_cast<int64_t>(text.size()) >= kHeaderBytes)
    throw ModelError(
        fmt::format("pipeline: stage {}'s carry is described in {} bytes, more than a header's {}", stage,
                    text.size(), kHeaderBytes));
  at::Tensor header = take_buffer({kHeaderBytes}, at::kByte, at::kCPU);
  header.zero_();
  std::memcpy(header.data_ptr<uint8_t>(), text.data(), text.size());
  ForwardSend& sends = forward_sends_[{micro_batch, stage}];
  sends.work.push_back(comm_->start_send(header, peer, tag(micro_batch, stage, false, 0)));
  sends.header = std::move(header);
  int64_t part = 1;
  for (const auto& [name, t] : carry.tensors())
    sends.work.push_back(comm_->start_send(t.detach(), peer, tag(micro_batch, stage, false, part++)));
}

void CarryExchange::start_receive_forward(int64_t peer, int64_t micro_batch, int64_t stage) {
  auto& header = headers_[{micro_batch, stage}];
  if (header) return;
  auto made = std::make_unique<Header>();  // kept only once its receive is posted
  made->bytes = take_buffer({kHeaderBytes}, at::kByte, at::kCPU);
  made->work = comm_->start_recv(made->bytes, peer, tag(micro_batch, stage - 1, false, 0));
  header = std::move(made);
}

core::Carry CarryExchange::receive_forward(int64_t peer, int64_t micro_batch, int64_t stage) {
  start_receive_forward(peer, micro_batch, stage);
  const auto begin = Clock::now();
  auto node = headers_.extract({micro_batch, stage});
  node.mapped()->work->wait();
  const std::vector<Entry> entries = parse_header(node.mapped()->bytes);
  node.mapped()->work.reset();  // which holds the buffer too
  give_back(std::move(node.mapped()->bytes));
  std::vector<at::Tensor> tensors;
  std::vector<std::unique_ptr<dist::PendingWork>> work;
  int64_t part = 1;
  for (const Entry& e : entries) {
    tensors.push_back(at::empty(e.sizes, at::TensorOptions().dtype(e.dtype).device(device_)));
    work.push_back(comm_->start_recv(tensors.back(), peer, tag(micro_batch, stage - 1, false, part++)));
  }
  for (auto& w : work) w->wait();
  receive_wait_s_ += seconds_since(begin);
  core::Carry carry;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].needs_grad) tensors[i].requires_grad_(true);
    carry.set(entries[i].name, tensors[i]);
  }
  return carry;
}

void CarryExchange::start_receive_backward(const core::Carry& output, int64_t peer, int64_t micro_batch,
                                           int64_t stage) {
  GradientReceive& receive = gradients_[{micro_batch, stage}];
  int64_t part = 1;
  for (const auto& [name, t] : output.tensors()) {
    if (!t.requires_grad()) continue;
    receive.names.push_back(name);
    receive.buffers.push_back(take_buffer(t.sizes(), t.scalar_type(), t.device()));
    receive.work.push_back(
        comm_->start_recv(receive.buffers.back(), peer, tag(micro_batch, stage + 1, true, part++)));
  }
}

std::map<std::string, at::Tensor> CarryExchange::receive_backward(int64_t micro_batch, int64_t stage) {
  auto node = gradients_.extract({micro_batch, stage});
  if (node.empty())
    throw ModelError(fmt::format("pipeline: no gradient receive started for micro-batch {} of stage {}",
                                 micro_batch, stage));
  const auto begin = Clock::now();
  for (auto& w : node.mapped().work) w->wait();
  receive_wait_s_ += seconds_since(begin);
  std::map<std::string, at::Tensor> grads;
  for (size_t i = 0; i < node.mapped().names.size(); ++i)
    grads[node.mapped().names[i]] = node.mapped().buffers[i];
  return grads;
}

void CarryExchange::send_backward(const core::Carry& input, int64_t peer, int64_t micro_batch,
                                  int64_t stage) {
  const auto begin = Clock::now();
  for (auto& w : backward_sends_) w->wait();  // their receives were posted with the forward sends
  backward_sends_.clear();
  send_wait_s_ += seconds_since(begin);
  int64_t part = 1;
  for (const auto& [name, t] : input.tensors()) {
    if (!t.requires_grad()) continue;
    at::Tensor grad = t.grad();
    if (!grad.defined()) grad = at::zeros_like(t, t.options().requires_grad(false));
    backward_sends_.push_back(comm_->start_send(grad, peer, tag(micro_batch, stage, true, part++)));
  }
}

void CarryExchange::wait_forward_send(int64_t micro_batch, int64_t stage) {
  auto node = forward_sends_.extract({micro_batch, stage});
  if (node.empty()) return;
  const auto begin = Clock::now();
  for (auto& w : node.mapped().work) w->wait();
  node.mapped().work.clear();  // the tensors they held
  send_wait_s_ += seconds_since(begin);
  give_back(std::move(node.mapped().header));
}

double CarryExchange::wait_sends() {
  const auto begin = Clock::now();
  for (auto& [key, sends] : forward_sends_) {
    for (auto& w : sends.work) w->wait();
    sends.work.clear();
    give_back(std::move(sends.header));
  }
  forward_sends_.clear();
  for (auto& w : backward_sends_) w->wait();
  backward_sends_.clear();
  const double waited = send_wait_s_ + seconds_since(begin);
  send_wait_s_ = 0;
  return waited;
}

double CarryExchange::take_receive_wait() {
  const double s = receive_wait_s_;
  receive_wait_s_ = 0;
  return s;
}

}  // namespace loom::parallel::pipeline
