#include "loom/train/optimizer.h"

#include <cmath>
#include <map>
#include <set>

#include "loom/kernels/adamw.h"
#include "loom/util/errors.h"

namespace loom::train {

namespace {

std::string shape_string(at::IntArrayRef sizes) {
  std::string s = "[";
  for (size_t i = 0; i < sizes.size(); ++i) s += (i ? ", " : "") + std::to_string(sizes[i]);
  return s + "]";
}

void check_unit_interval(const char* key, double value) {
  if (!(value >= 0.0 && value < 1.0))
    throw ConfigError(fmt::format("AdamW: {} = {} is out of range; valid is [0, 1)", key, value));
}

}  // namespace

AdamW::AdamW(std::vector<NamedParam> params, AdamWOptions options) : options_(options) {
  check(params, options);
  at::NoGradGuard no_grad;
  slots_.reserve(params.size());
  for (auto& np : params) {
    Slot s;
    s.decay = decays(np);
    s.exp_avg = at::zeros_like(np.param, np.param.options().dtype(at::kFloat));
    s.exp_avg_sq = at::zeros_like(np.param, np.param.options().dtype(at::kFloat));
    if (np.param.scalar_type() == at::kBFloat16 && options.split_master)
      s.split.residual = at::zeros_like(np.param, np.param.options().dtype(at::kShort));  // master == p
    else if (np.param.scalar_type() == at::kBFloat16)
      s.master = np.param.detach().to(at::kFloat, /*non_blocking=*/false, /*copy=*/true);
    s.p = std::move(np);
    slots_.push_back(std::move(s));
  }
}

void AdamW::check(const std::vector<NamedParam>& params, const AdamWOptions& options) {
  check_unit_interval("beta1", options.beta1);
  check_unit_interval("beta2", options.beta2);
  if (!(options.eps > 0.0)) throw ConfigError(fmt::format("AdamW: eps = {} must be > 0", options.eps));
  if (!(options.weight_decay >= 0.0))
    throw ConfigError(fmt::format("AdamW: weight_decay = {} must be >= 0", options.weight_decay));

  std::set<std::string> seen;
  for (const auto& np : params) {
    if (!np.param.defined()) throw ModelError(fmt::format("AdamW: parameter '{}' is undefined", np.name));
    const auto dtype = np.param.scalar_type();
    if (dtype != at::kFloat && dtype != at::kBFloat16)
      throw ModelError(fmt::format("AdamW: parameter '{}' has dtype {}; valid are float32 and bfloat16",
                                   np.name, c10::toString(dtype)));
    if (!seen.insert(np.name).second)
      throw ModelError(fmt::format("AdamW: parameter name '{}' is given twice", np.name));
  }
}

bool AdamW::decays(const NamedParam& p) { return p.param.dim() >= 2; }

namespace {

kernels::AdamWHyper hyper_of(const AdamWOptions& options, double lr, int64_t step) {
  kernels::AdamWHyper h;
  h.lr = lr;
  h.beta1 = options.beta1;
  h.beta2 = options.beta2;
  h.eps = options.eps;
  h.weight_decay = options.weight_decay;
  h.step = step;
  return h;
}

}  // namespace

void adam_update(at::Tensor& w, const at::Tensor& g, at::Tensor& exp_avg, at::Tensor& exp_avg_sq, double lr,
                 int64_t step, const AdamWOptions& options) {
  // m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; w -= lr/(1-b1^t) * m / (sqrt(v/(1-b2^t)) + eps),
  // in one pass (the decay, decoupled, is the caller's).
  kernels::adamw_step({{w, g.contiguous(), exp_avg, exp_avg_sq, /*decay=*/false, {}}},
                      hyper_of(options, lr, step));
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++step_;
  // Every parameter with a gradient in one multi-tensor pass: the fp32 tensor updated is the
  // parameter itself or the master copy of a bf16 one, which is then rounded into the parameter.
  std::vector<kernels::AdamWTensor> tensors;
  for (auto& s : slots_) {
    const at::Tensor& grad = s.p.param.grad();
    if (!grad.defined()) continue;
    if (s.split.residual.defined()) {
      tensors.push_back({at::Tensor(), grad.contiguous(), s.exp_avg, s.exp_avg_sq, s.decay,
                         s.p.param.detach(), s.split.residual, &s.split.ties});
      continue;
    }
    const bool bf16 = s.master.defined();
    tensors.push_back({bf16 ? s.master : s.p.param.detach(), grad.contiguous(), s.exp_avg, s.exp_avg_sq,
                       s.decay, bf16 ? s.p.param.detach() : at::Tensor()});
  }
  kernels::adamw_step(tensors, hyper_of(options_, lr, step_));
}

void AdamW::zero_grad() {
  for (auto& s : slots_) s.p.param.mutable_grad() = at::Tensor();
}

std::vector<std::pair<std::string, at::Tensor>> AdamW::state_dict() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  out.reserve(slots_.size() * 3 + 1);
  for (const auto& s : slots_) {
    out.emplace_back("exp_avg." + s.p.name, s.exp_avg);
    out.emplace_back("exp_avg_sq." + s.p.name, s.exp_avg_sq);
    if (s.master.defined()) out.emplace_back("master." + s.p.name, s.master);
    if (s.split.residual.defined())
      out.emplace_back("master." + s.p.name, memory::join_master(s.p.param, s.split));
  }
  out.emplace_back("step", at::scalar_tensor(step_, at::kLong));
  return out;
}

std::map<std::string, at::Tensor> checked_adamw_state(
    const std::vector<NamedParam>& params, const std::vector<std::pair<std::string, at::Tensor>>& state) {
  std::map<std::string, at::Tensor> given;
  for (const auto& [key, value] : state) {
    if (!given.emplace(key, value).second)
      throw CheckpointError(fmt::format("optimizer state: entry '{}' appears twice", key));
  }
  std::map<std::string, at::Tensor> out;
  auto take = [&](const std::string& key, at::IntArrayRef shape) {
    auto it = given.find(key);
    if (it == given.end() || !it->second.defined())
      throw CheckpointError(
          fmt::format("optimizer state: missing entry '{}' (expected shape {})", key, shape_string(shape)));
    if (it->second.sizes() != shape)
      throw CheckpointError(fmt::format("optimizer state: entry '{}' has shape {}, expected {}", key,
                                        shape_string(it->second.sizes()), shape_string(shape)));
    if (key != "step" && !at::isFloatingType(it->second.scalar_type()))
      throw CheckpointError(fmt::format("optimizer state: entry '{}' has dtype {}, expected floating point",
                                        key, c10::toString(it->second.scalar_type())));
    out.emplace(key, it->second);
    given.erase(it);
  };
  for (const auto& p : params) {
    take("exp_avg." + p.name, p.param.sizes());
    take("exp_avg_sq." + p.name, p.param.sizes());
    if (p.param.scalar_type() == at::kBFloat16) take("master." + p.name, p.param.sizes());
  }
  take("step", {});
  const at::ScalarType step = out.at("step").scalar_type();
  if (at::isFloatingType(step) || step == at::kBool)
    throw CheckpointError(
        fmt::format("optimizer state: entry 'step' has dtype {}, expected an integer", c10::toString(step)));
  if (!given.empty())
    throw CheckpointError(
        fmt::format("optimizer state: unexpected entry '{}' (no parameter of that name in this optimizer)",
                    given.begin()->first));
  return out;
}

void AdamW::load_state_dict(const std::vector<std::pair<std::string, at::Tensor>>& state) {
  // Everything is checked before anything changes, so a bad checkpoint leaves the optimizer as it was.
  std::vector<NamedParam> params;
  for (const auto& s : slots_) params.push_back(s.p);
  const auto checked = checked_adamw_state(params, state);
  at::NoGradGuard no_grad;
  for (auto& s : slots_) {
    s.exp_avg.copy_(checked.at("exp_avg." + s.p.name));
    s.exp_avg_sq.copy_(checked.at("exp_avg_sq." + s.p.name));
    if (s.master.defined()) {
      s.master.copy_(checked.at("master." + s.p.name));
      s.p.param.copy_(s.master);
    }
    if (s.split.residual.defined())
      s.split = memory::split_master(checked.at("master." + s.p.name).to(at::kFloat), s.p.param);
  }
  step_ = checked.at("step").item<int64_t>();
}

int64_t AdamW::state_bytes() const {
  int64_t bytes = 0;
  for (const auto& s : slots_) {
    bytes += s.exp_avg.nbytes() + s.exp_avg_sq.nbytes();
    if (s.master.defined()) bytes += s.master.nbytes();
    if (s.split.residual.defined()) bytes += s.split.bytes();
  }
  return bytes;
}

}  // namespace loom::train
