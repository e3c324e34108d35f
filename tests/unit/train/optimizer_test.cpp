#include "loom/train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "loom/util/errors.h"

namespace loom::train {
namespace {

using nlohmann::json;

at::Tensor leaf(const std::vector<double>& values, at::IntArrayRef shape, at::ScalarType dtype = at::kFloat) {
  return at::tensor(values, at::kDouble).reshape(shape).to(dtype).set_requires_grad(true);
}

at::Tensor from_json(const json& j) {
  std::vector<double> flat;
  std::vector<int64_t> shape;
  if (j.at(0).is_array()) {
    for (const auto& row : j)
      for (const auto& x : row) flat.push_back(x.get<double>());
    shape = {static_cast<int64_t>(j.size()), static_cast<int64_t>(j.at(0).size())};
  } else {
    for (const auto& x : j) flat.push_back(x.get<double>());
    shape = {static_cast<int64_t>(j.size())};
  }
  return at::tensor(flat, at::kDouble).reshape(shape);
}

// AdamW on one scalar, written out in double straight from the update rule.
double adamw_scalar(double p, const std::vector<double>& grads, const std::vector<double>& lrs, double wd) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  double m = 0, v = 0;
  for (size_t i = 0; i < grads.size(); ++i) {
    const double t = static_cast<double>(i + 1), g = grads[i], lr = lrs[i];
    p *= 1 - lr * wd;
    m = b1 * m + (1 - b1) * g;
    v = b2 * v + (1 - b2) * g * g;
    const double mhat = m / (1 - std::pow(b1, t)), vhat = v / (1 - std::pow(b2, t));
    p -= lr * mhat / (std::sqrt(vhat) + eps);
  }
  return p;
}

struct Fixture {
  json j = [] {
    std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/train_adamw/adamw_reference.json");
    return json::parse(in);
  }();
};

TEST(AdamW, DecaysOnlyMatrices) {
  EXPECT_TRUE(AdamW::decays({"w", at::zeros({2, 2})}));
  EXPECT_TRUE(AdamW::decays({"conv", at::zeros({2, 3, 4})}));
  EXPECT_FALSE(AdamW::decays({"bias", at::zeros({2})}));
  EXPECT_FALSE(AdamW::decays({"scale", at::zeros({})}));
}

// Three steps on a 2x2 weight and a bias, against torch.optim.AdamW (fixture) and against the scalar
// rule in double; the bias must not decay even though weight_decay is set.
TEST(AdamW, MatchesReferenceWithAndWithoutDecay) {
  const json j = Fixture().j;
  std::vector<double> lrs = j["lrs"].get<std::vector<double>>();
  for (const auto& c : j["cases"]) {
    const double wd = c["weight_decay"].get<double>();
    SCOPED_TRACE("weight_decay " + std::to_string(wd));
    at::Tensor w = from_json(j["weight0"]).to(at::kFloat).set_requires_grad(true);
    at::Tensor b = from_json(j["bias0"]).to(at::kFloat).set_requires_grad(true);
    AdamW opt({{"w", w}, {"b", b}}, AdamWOptions{0.9, 0.999, 1e-8, wd});
    for (size_t s = 0; s < 3; ++s) {
      w.mutable_grad() = from_json(j["grads"][s]["weight"]).to(at::kFloat);
      b.mutable_grad() = from_json(j["grads"][s]["bias"]).to(at::kFloat);
      opt.step(lrs[s]);
      const at::Tensor want_w = from_json(c["after_step"][s]["weight"]);
      const at::Tensor want_b = from_json(c["after_step"][s]["bias"]);
      EXPECT_TRUE(at::allclose(w.to(at::kDouble), want_w, 0, 1e-6)) << "step " << s + 1 << "\n" << w;
      EXPECT_TRUE(at::allclose(b.to(at::kDouble), want_b, 0, 1e-6)) << "step " << s + 1 << "\n" << b;
    }
    EXPECT_EQ(opt.step_count(), 3);

    // The same, element by element, from the scalar rule.
    const at::Tensor w0 = from_json(j["weight0"]).flatten(), b0 = from_json(j["bias0"]);
    for (int64_t e = 0; e < 4; ++e) {
      std::vector<double> g;
      for (size_t s = 0; s < 3; ++s)
        g.push_back(from_json(j["grads"][s]["weight"]).flatten()[e].item<double>());
      EXPECT_NEAR(w.flatten()[e].item<double>(), adamw_scalar(w0[e].item<double>(), g, lrs, wd), 1e-6);
    }
    for (int64_t e = 0; e < 2; ++e) {
      std::vector<double> g;
      for (size_t s = 0; s < 3; ++s) g.push_back(from_json(j["grads"][s]["bias"])[e].item<double>());
      EXPECT_NEAR(b[e].item<double>(), adamw_scalar(b0[e].item<double>(), g, lrs, 0.0), 1e-6);
    }
  }
}

TEST(AdamW, SkipsParamsWithoutGradAndZeroGradFrees) {
  at::Tensor w = leaf({1, 2, 3, 4}, {2, 2});
  at::Tensor b = leaf({5, 6}, {2});
  AdamW opt({{"w", w}, {"b", b}}, AdamWOptions{0.9, 0.999, 1e-8, 0.1});
  w.mutable_grad() = at::ones({2, 2});
  opt.step(0.1);
  EXPECT_TRUE(at::equal(b, at::tensor({5.0f, 6.0f})));  // no grad: untouched, not even decayed
  // First step moves each element by lr*g/(|g|+eps) after decay by (1 - lr*wd).
  EXPECT_NEAR(w[0][0].item<double>(), 1.0 * (1 - 0.1 * 0.1) - 0.1 * 1 / (1 + 1e-8), 1e-6);
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  EXPECT_EQ(opt.state_bytes(), (4 + 4 + 2 + 2) * 4);
}

// A bf16 param keeps an fp32 master: an update smaller than bf16's spacing is kept in the master
// and the param is always the master rounded to bf16.
TEST(AdamW, Bf16ParamKeepsFp32Master) {
  at::Tensor p = leaf({1.0, 1.0}, {2}, at::kBFloat16);
  AdamW opt({{"scale", p}}, AdamWOptions{});
  EXPECT_EQ(opt.state_bytes(), 3 * 2 * 4);  // exp_avg, exp_avg_sq, master
  auto master_of = [&] {
    for (const auto& [key, t] : opt.state_dict())
      if (key == "master.scale") return t;
    return at::Tensor();
  };
  ASSERT_TRUE(master_of().defined());
  EXPECT_EQ(master_of().scalar_type(), at::kFloat);

  const double lr = 1e-3;
  for (int s = 1; s <= 5; ++s) {
    p.mutable_grad() = at::ones({2}, at::kBFloat16);
    opt.step(lr);
    // With a constant grad g, mhat = g and vhat = g^2 every step: each step moves lr*g/(|g|+eps).
    const double want = 1.0 - s * lr / (1 + 1e-8);
    const at::Tensor master = master_of();
    EXPECT_NEAR(master[0].item<double>(), want, 1e-6) << "step " << s;
    EXPECT_TRUE(at::equal(p, master.to(at::kBFloat16))) << "step " << s;
    if (s == 1) {
      // 0.999 rounds back to 1.0 in bf16 (spacing 2^-8 below 1): the update lives only in the master.
      EXPECT_EQ(p[0].item<float>(), 1.0f);
      EXPECT_NE(master[0].item<float>(), p[0].item<float>());
    }
  }
  // After five steps the master (0.995) rounds to 1 - 2^-8: the small steps added up.
  EXPECT_EQ(p[0].item<float>(), 1.0f - 1.0f / 256);
}

struct Model {
  at::Tensor w = leaf({0.5, -1.0, 1.5, 2.0}, {2, 2});
  at::Tensor b = leaf({0.1, -0.2}, {2});
  at::Tensor s = leaf({1.0, 0.5, -0.25}, {3}, at::kBFloat16);
  std::vector<NamedParam> params() { return {{"w", w}, {"b", b}, {"s", s}}; }
  Model clone() const {
    Model m;
    m.w = w.detach().clone().set_requires_grad(true);
    m.b = b.detach().clone().set_requires_grad(true);
    m.s = s.detach().clone().set_requires_grad(true);
    return m;
  }
  void set_grads(int k) {
    w.mutable_grad() = at::tensor({0.1f, -0.2f, 0.3f, 0.05f}).reshape({2, 2}) * (k + 1);
    b.mutable_grad() = at::tensor({0.4f, -0.1f}) / (k + 1);
    s.mutable_grad() = at::tensor({0.3f, -0.7f, 0.2f}).to(at::kBFloat16) * (k % 2 ? 1 : -1);
  }
};

TEST(AdamW, StateDictRoundTripReproducesNextStep) {
  const AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
  Model a;
  AdamW opt_a(a.params(), options);
  for (int k = 0; k < 3; ++k) {
    a.set_grads(k);
    opt_a.step(0.01 * (k + 1));
  }
  // A fresh optimizer on copies of the params, loaded from the first one's state.
  Model b = a.clone();
  AdamW opt_b(b.params(), options);
  auto state = opt_a.state_dict();
  for (auto& [key, t] : state) t = t.clone();  // as a checkpoint would hold them
  opt_b.load_state_dict(state);
  EXPECT_EQ(opt_b.step_count(), 3);

  a.set_grads(3);
  b.set_grads(3);
  opt_a.step(0.02);
  opt_b.step(0.02);
  EXPECT_TRUE(at::equal(a.w, b.w));
  EXPECT_TRUE(at::equal(a.b, b.b));
  EXPECT_TRUE(at::equal(a.s, b.s));
  const auto sa = opt_a.state_dict(), sb = opt_b.state_dict();
  ASSERT_EQ(sa.size(), sb.size());
  for (size_t i = 0; i < sa.size(); ++i) {
    EXPECT_EQ(sa[i].first, sb[i].first);
    EXPECT_TRUE(at::equal(sa[i].second, sb[i].second)) << sa[i].first;
  }
}

TEST(AdamW, SplitMasterSavesTwoBytesPerParameterAndStepsAlike) {
  // A bf16 parameter large enough to span several of the fused step's tasks.
  at::manual_seed(3);
  const at::Tensor start = at::randn({70000}).to(at::kBFloat16);
  at::Tensor a = start.clone().set_requires_grad(true), b = start.clone().set_requires_grad(true);
  Model ma, mb = ma.clone();
  auto params_a = ma.params(), params_b = mb.params();
  params_a.push_back({"big", a});
  params_b.push_back({"big", b});
  AdamWOptions options{0.9, 0.95, 1e-8, 0.1};
  AdamW plain(params_a, options);
  options.split_master = true;
  AdamW split(params_b, options);
  // 2 bytes less for each bf16 element (the 3 of "s" and the 70000 of "big"), none for fp32 ones.
  EXPECT_EQ(plain.state_bytes() - split.state_bytes(), 2 * (3 + 70000));
  for (int k = 0; k < 4; ++k) {
    ma.set_grads(k);
    mb.set_grads(k);
    const at::Tensor g = at::randn({70000}).to(at::kBFloat16);
    a.mutable_grad() = g;
    b.mutable_grad() = g.clone();
    plain.step(0.01 * (k + 1));
    split.step(0.01 * (k + 1));
    EXPECT_TRUE(at::equal(a, b)) << "step " << k;
    EXPECT_TRUE(at::equal(ma.s, mb.s)) << "step " << k;
    // The same state entries, bit for bit: the split master joined is the fp32 master.
    const auto sa = plain.state_dict(), sb = split.state_dict();
    ASSERT_EQ(sa.size(), sb.size());
    for (size_t i = 0; i < sa.size(); ++i) {
      EXPECT_EQ(sa[i].first, sb[i].first);
      EXPECT_EQ(sa[i].second.scalar_type(), sb[i].second.scalar_type()) << sa[i].first;
      EXPECT_TRUE(at::equal(sa[i].second, sb[i].second)) << sa[i].first << " step " << k;
    }
  }
}

TEST(AdamW, SplitAndSeparateMastersLoadEachOthersState) {
  // A state saved with one form of the master loads into the other, and the next steps agree.
  const AdamWOptions separate{0.9, 0.95, 1e-8, 0.1};
  AdamWOptions split = separate;
  split.split_master = true;
  for (const bool from_split : {true, false}) {
    Model a;
    AdamW opt_a(a.params(), from_split ? split : separate);
    for (int k = 0; k < 3; ++k) {
      a.set_grads(k);
      opt_a.step(0.01 * (k + 1));
    }
    Model b = a.clone();
    AdamW opt_b(b.params(), from_split ? separate : split);
    auto state = opt_a.state_dict();
    for (auto& [key, t] : state) t = t.clone();
    opt_b.load_state_dict(state);
    for (int k = 3; k < 5; ++k) {
      a.set_grads(k);
      b.set_grads(k);
      opt_a.step(0.02);
      opt_b.step(0.02);
    }
    EXPECT_TRUE(at::equal(a.s, b.s)) << from_split;
    EXPECT_TRUE(at::equal(a.w, b.w)) << from_split;
    const auto sa = opt_a.state_dict(), sb = opt_b.state_dict();
    for (size_t i = 0; i < sa.size(); ++i) EXPECT_TRUE(at::equal(sa[i].second, sb[i].second)) << sa[i].first;
  }
}

TEST(AdamW, StateDictKeys) {
  Model m;
  AdamW opt(m.params(), AdamWOptions{});
  std::vector<std::string> keys;
  for (const auto& [key, t] : opt.state_dict()) keys.push_back(key);
  EXPECT_EQ(keys, (std::vector<std::string>{"exp_avg.w", "exp_avg_sq.w", "exp_avg.b", "exp_avg_sq.b",
                                            "exp_avg.s", "exp_avg_sq.s", "master.s", "step"}));
}

std::string load_error(AdamW& opt, const std::vector<std::pair<std::string, at::Tensor>>& state) {
  try {
    opt.load_state_dict(state);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

TEST(AdamW, LoadRejectsMissingMisshapedAndUnknownEntries) {
  Model m;
  AdamW opt(m.params(), AdamWOptions{});
  m.set_grads(0);
  opt.step(0.01);
  const auto good = opt.state_dict();

  auto without = [&](const std::string& drop) {
    std::vector<std::pair<std::string, at::Tensor>> out;
    for (const auto& e : good)
      if (e.first != drop) out.push_back(e);
    return out;
  };
  EXPECT_NE(load_error(opt, without("exp_avg_sq.b")).find("missing entry 'exp_avg_sq.b'"), std::string::npos);
  EXPECT_NE(load_error(opt, without("master.s")).find("'master.s'"), std::string::npos);
  EXPECT_NE(load_error(opt, without("step")).find("'step'"), std::string::npos);

  auto misshaped = good;
  misshaped[0].second = at::zeros({4});
  const std::string msg = load_error(opt, misshaped);
  EXPECT_NE(msg.find("'exp_avg.w'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[4]"), std::string::npos) << msg;
  EXPECT_NE(msg.find("[2, 2]"), std::string::npos) << msg;

  auto extra = good;
  extra.emplace_back("exp_avg.gone", at::zeros({2}));
  EXPECT_NE(load_error(opt, extra).find("'exp_avg.gone'"), std::string::npos);

  // A rejected load changes nothing.
  auto zeroed = without("step");
  for (auto& e : zeroed) e.second = at::zeros_like(e.second);
  load_error(opt, zeroed);
  EXPECT_EQ(opt.step_count(), 1);
  EXPECT_GT(opt.state_dict()[0].second.abs().sum().item<double>(), 0.0);
}

TEST(AdamW, RejectsBadInputs) {
  EXPECT_THROW(AdamW({{"w", at::zeros({2}, at::kDouble)}}, AdamWOptions{}), ModelError);
  EXPECT_THROW(AdamW({{"w", at::zeros({2})}, {"w", at::zeros({2})}}, AdamWOptions{}), ModelError);
  EXPECT_THROW(AdamW({{"w", at::zeros({2})}}, AdamWOptions{1.0, 0.999, 1e-8, 0.0}), ConfigError);
}

}  // namespace
}  // namespace loom::train
