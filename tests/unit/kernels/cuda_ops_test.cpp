// Loom's CUDA kernels (kernels/cuda) against the composite references, forward and backward: on
// the GPU in a CUDA build, under the SIMT emulator (the same kernel source, run on the CPU)
// otherwise. Shapes are chosen to leave partial tiles, partial warps' worth of columns, empty
// segments and head dimensions that do not fill a lane's slice.
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "delta_rule_fixture.h"
#include "loom/kernels/attention.h"
#include "loom/kernels/cuda/ops.h"
#include "loom/kernels/delta_rule.h"
#include "loom/kernels/pointwise.h"

namespace loom::kernels {
namespace {

at::Tensor on_device(const at::Tensor& t) { return t.contiguous().to(cuda::device()); }

void expect_close(const at::Tensor& got, const at::Tensor& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  const at::Tensor g = got.to(at::kCPU).to(at::kFloat), w = want.to(at::kCPU).to(at::kFloat);
  const double error = (g - w).abs().max().item<double>();
  const double scale = std::max(1.0, w.abs().max().item<double>());
  EXPECT_LE(error, tolerance * scale) << what;
}

// A CUDA build on a machine without a GPU cannot run the kernels: the tests skip there.
class CudaKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::emulated() && !torch::cuda::is_available()) GTEST_SKIP() << "a CUDA build, but no GPU here";
  }
};

double tolerance_of(at::ScalarType dtype) { return dtype == at::kFloat ? 1e-5 : 2e-2; }

TEST_F(CudaKernels, RunWhereTheBuildSays) { EXPECT_EQ(cuda::device().is_cuda(), !cuda::emulated()); }

TEST_F(CudaKernels, RmsNormMatchesTheComposite) {
  struct Case {
    int64_t rows, dim;
    at::ScalarType x_type, weight_type;
  };
  for (const Case& c : {Case{9, 64, at::kFloat, at::kFloat}, Case{5, 300, at::kFloat, at::kFloat},
                        Case{7, 200, at::kBFloat16, at::kBFloat16}, Case{6, 130, at::kBFloat16, at::kFloat},
                        Case{4, 100, at::kHalf, at::kHalf}}) {
    const std::string what = fmt::format("rows {}, dim {}, x {}, weight {}", c.rows, c.dim,
                                         c10::toString(c.x_type), c10::toString(c.weight_type));
    at::manual_seed(3);
    const at::Tensor x = at::randn({c.rows, c.dim}).to(c.x_type);
    const at::Tensor weight = (1 + 0.1 * at::randn({c.dim})).to(c.weight_type);
    const at::Tensor x_ref = x.clone().set_requires_grad(true),
                     w_ref = weight.clone().set_requires_grad(true);
    const at::Tensor y_ref = rms_norm_composite(x_ref, w_ref, 1e-6);
    const at::Tensor grad = at::randn(y_ref.sizes()).to(y_ref.scalar_type());
    (y_ref.to(at::kFloat) * grad.to(at::kFloat)).sum().backward();

    const auto [y, rstd] = cuda::rms_norm_forward(on_device(x), on_device(weight), 1e-6);
    EXPECT_EQ(y.scalar_type(), y_ref.scalar_type()) << what;
    const double tolerance = tolerance_of(c.x_type);
    expect_close(y, y_ref, tolerance, what + ": y");
    expect_close(rstd, at::rsqrt(x.to(at::kFloat).pow(2).mean(-1) + 1e-6), 1e-5, what + ": rstd");
    const auto [dx, dweight] =
        cuda::rms_norm_backward(on_device(grad), on_device(x), on_device(weight), rstd);
    expect_close(dx, x_ref.grad(), tolerance * 2, what + ": dx");
    expect_close(dweight, w_ref.grad(), tolerance * 2, what + ": dweight");
  }
}

TEST_F(CudaKernels, SwigluMatchesTheComposite) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    at::manual_seed(4);
    // 1000 elements: the last block is partial; gates span the saturated ends of the sigmoid.
    const at::Tensor gate = (at::randn({10, 100}) * 6).to(dtype), up = at::randn({10, 100}).to(dtype);
    const at::Tensor g_ref = gate.clone().set_requires_grad(true), u_ref = up.clone().set_requires_grad(true);
    // The reference in fp32 from the same rounded values (CPU silu has no fp16 kernel).
    const at::Tensor y_ref = swiglu_composite(g_ref.to(at::kFloat), u_ref.to(at::kFloat));
    const at::Tensor grad = at::randn({10, 100}).to(dtype);
    (y_ref.to(at::kFloat) * grad.to(at::kFloat)).sum().backward();
    const std::string what = c10::toString(dtype);
    const double tolerance = tolerance_of(dtype);
    expect_close(cuda::swiglu_forward(on_device(gate), on_device(up)), y_ref, tolerance, what + ": y");
    const auto [dgate, dup] = cuda::swiglu_backward(on_device(grad), on_device(gate), on_device(up));
    expect_close(dgate, g_ref.grad(), tolerance, what + ": d gate");
    expect_close(dup, u_ref.grad(), tolerance, what + ": d up");
  }
}

// Angle rows whose two halves differ (as M-RoPE's and 2D vision RoPE's tables may), so the
// backward's transpose is checked in general, not only as a rotation by minus the angle.
TEST_F(CudaKernels, RotaryMatchesTheComposite) {
  for (at::ScalarType dtype : {at::kFloat, at::kBFloat16}) {
    at::manual_seed(5);
    const int64_t positions = 11, heads = 3, dim = 24;
    const at::Tensor x = at::randn({positions, heads, dim}).to(dtype);
    const at::Tensor angles = at::rand({positions, dim}) * 6;
    const at::Tensor cos = angles.cos(), sin = angles.sin();
    const at::Tensor x_ref = x.clone().set_requires_grad(true);
    const at::Tensor y_ref = rotary_composite(x_ref, cos.unsqueeze(1), sin.unsqueeze(1));
    const at::Tensor grad = at::randn(y_ref.sizes()).to(dtype);
    (y_ref.to(at::kFloat) * grad.to(at::kFloat)).sum().backward();
    const std::string what = c10::toString(dtype);
    const double tolerance = tolerance_of(dtype);
    expect_close(cuda::rotary_forward(on_device(x), on_device(cos), on_device(sin)), y_ref, tolerance,
                 what + ": y");
    expect_close(cuda::rotary_backward(on_device(grad), on_device(cos), on_device(sin)), x_ref.grad(),
                 tolerance, what + ": dx");
  }
}

struct AttentionCase {
  std::vector<int64_t> cu;
  int64_t heads, kv_heads, dim;
  bool causal;
  int64_t window;
  at::ScalarType dtype;
};

void compare_attention(const AttentionCase& c) {
  const std::string what =
      fmt::format("cu [{}], {}/{} heads, dim {}, causal {}, window {}, {}", fmt::join(c.cu, ","), c.heads,
                  c.kv_heads, c.dim, c.causal, c.window, c10::toString(c.dtype));
  at::manual_seed(6);
  const int64_t tokens = c.cu.back();
  const at::Tensor q = at::randn({tokens, c.heads, c.dim}).to(c.dtype);
  const at::Tensor k = at::randn({tokens, c.kv_heads, c.dim}).to(c.dtype);
  const at::Tensor v = at::randn({tokens, c.kv_heads, c.dim}).to(c.dtype);
  const at::Tensor grad = at::randn({tokens, c.heads, c.dim}).to(c.dtype);
  // Reference: the composite in fp32 from the same (possibly bf16-rounded) values, and the CPU flash
  // kernel's log-sum-exp (checked against the scores in attention_test).
  const AttentionOptions options{c.causal, 0, c.window};
  at::Tensor q_ref = q.to(at::kFloat).set_requires_grad(true),
             k_ref = k.to(at::kFloat).set_requires_grad(true),
             v_ref = v.to(at::kFloat).set_requires_grad(true);
  const at::Tensor out_ref = composite_attention(q_ref, k_ref, v_ref, c.cu, options);
  (out_ref * grad.to(at::kFloat)).sum().backward();
  at::Tensor lse_ref;
  flash_attention(q.to(at::kFloat), k.to(at::kFloat), v.to(at::kFloat), c.cu, options, &lse_ref);

  cuda::AttentionShape shape{c.cu, c.causal, static_cast<float>(1 / std::sqrt(static_cast<double>(c.dim))),
                             c.window};
  const auto [out, lse] = cuda::attention_forward(on_device(q), on_device(k), on_device(v), shape);
  const double tolerance = tolerance_of(c.dtype);
  EXPECT_EQ(out.scalar_type(), c.dtype) << what;
  expect_close(out, out_ref, tolerance, what + ": out");
  expect_close(lse, lse_ref, 1e-5, what + ": lse");
  const auto [dq, dk, dv] =
      cuda::attention_backward(on_device(grad), on_device(q), on_device(k), on_device(v), out, lse, shape);
  expect_close(dq, q_ref.grad(), tolerance * 5, what + ": dq");
  expect_close(dk, k_ref.grad(), tolerance * 5, what + ": dk");
  expect_close(dv, v_ref.grad(), tolerance * 5, what + ": dv");
}

// Segments of 37, 0 and 40 tokens: partial 32-row tiles and an empty segment; GQA, two query
// heads per key/value head.
TEST_F(CudaKernels, AttentionMatchesTheCompositeOnPackedSegments) {
  for (bool causal : {true, false}) compare_attention({{0, 37, 37, 77}, 4, 2, 16, causal, 0, at::kFloat});
}

TEST_F(CudaKernels, AttentionSlidingWindowsMatchTheComposite) {
  compare_attention({{0, 45, 70}, 2, 1, 16, true, 5, at::kFloat});
  compare_attention({{0, 45, 70}, 2, 2, 16, false, 40, at::kFloat});
}

// Head dimensions that fill a lane's slice only partly (40 of 64, 72 of 128) and the widest (160 of
// 256, with 16-row streamed tiles); bf16 and fp16 storage.
TEST_F(CudaKernels, AttentionHeadDimensionsAndHalfPrecision) {
  compare_attention({{0, 33}, 2, 1, 40, true, 0, at::kFloat});
  compare_attention({{0, 20, 33}, 1, 1, 72, false, 0, at::kFloat});
  compare_attention({{0, 35}, 1, 1, 160, true, 0, at::kFloat});
  compare_attention({{0, 30, 50}, 2, 1, 32, true, 0, at::kBFloat16});
  compare_attention({{0, 40}, 2, 2, 16, false, 0, at::kHalf});
}

// The tensor-core kernels (bf16 and fp16 up to head dimension 128, padded to 64, 80 or 128): 64-row
// tiles cut by segments of 37, 0, 100 and 130 tokens, four query heads on one key/value head,
// causal or not, windows; rows read 8 elements at a time, or one at a time when the head dimension
// is no multiple of 8 (36); a 16-bit head dimension above 128 takes the CUDA-core kernels.
TEST_F(CudaKernels, AttentionOnTheTensorCores) {
  compare_attention({{0, 37, 37, 137, 267}, 4, 1, 64, true, 0, at::kBFloat16});
  compare_attention({{0, 70, 150}, 2, 2, 80, false, 0, at::kBFloat16});
  compare_attention({{0, 100}, 2, 1, 128, true, 0, at::kHalf});
  compare_attention({{0, 90, 160}, 2, 1, 40, true, 20, at::kBFloat16});
  compare_attention({{0, 90}, 1, 1, 72, false, 33, at::kHalf});
  compare_attention({{0, 45, 110}, 2, 1, 36, true, 0, at::kBFloat16});
  compare_attention({{0, 50}, 1, 1, 160, true, 0, at::kBFloat16});
}

// ---- The gated delta rule ----

struct DeltaRuleInputs {
  at::Tensor q, k, v, g, beta, state0;  // fp32 on the CPU; state0 defined
  std::vector<int64_t> cu;
};

cuda::DeltaRuleShape delta_shape(const DeltaRuleInputs& x, int64_t chunk) {
  return {x.cu, chunk, static_cast<float>(1 / std::sqrt(static_cast<double>(x.q.size(2))))};
}

cuda::DeltaRuleForward delta_forward(const DeltaRuleInputs& x, int64_t chunk) {
  return cuda::delta_rule_forward(on_device(x.q), on_device(x.k), on_device(x.v), on_device(x.g),
                                  on_device(x.beta), on_device(x.state0), delta_shape(x, chunk));
}

// The kernel's outputs and gradients (of q, k, v, g, beta, state0) against the composite's by
// autograd, for output and final-state gradients dout and dfinal (either may be undefined: zero).
// Gradients relative to the largest where it exceeds one, absolute below.
void compare_delta_rule(const DeltaRuleInputs& x, int64_t chunk, const at::Tensor& dout,
                        const at::Tensor& dfinal, const std::string& what) {
  std::vector<at::Tensor> leaves;
  for (const at::Tensor& t : {x.q, x.k, x.v, x.g, x.beta, x.state0})
    leaves.push_back(t.clone().requires_grad_(true));
  const DeltaRuleResult ref = composite_delta_rule(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                                                   x.cu, leaves[5], {0, chunk});
  at::Tensor loss = at::zeros({});
  if (dout.defined()) loss = loss + (ref.out * dout).sum();
  if (dfinal.defined()) loss = loss + (ref.final_state * dfinal).sum();
  loss.backward();

  const cuda::DeltaRuleForward f = delta_forward(x, chunk);
  expect_close(f.out, ref.out, 1e-5, what + ": out");
  expect_close(f.final_state, ref.final_state, 1e-5, what + ": final state");
  const cuda::DeltaRuleGrads d = cuda::delta_rule_backward(
      on_device(x.q), on_device(x.k), on_device(x.v), on_device(x.g), on_device(x.beta), f.checkpoints,
      dout.defined() ? on_device(dout) : at::Tensor(), dfinal.defined() ? on_device(dfinal) : at::Tensor(),
      delta_shape(x, chunk));
  const at::Tensor got[] = {d.dq, d.dk, d.dv, d.dg, d.dbeta, d.dstate0};
  static const char* names[] = {"dq", "dk", "dv", "dg", "dbeta", "dstate0"};
  for (size_t i = 0; i < leaves.size(); ++i) {
    const at::Tensor want = leaves[i].grad().defined() ? leaves[i].grad() : at::zeros_like(leaves[i]);
    expect_close(got[i], want, 1e-5, what + ": " + names[i]);
  }
}

// Transformers' chunked and token-by-token forms on every fixture case: lengths 1, 63, 64, 65 and
// 4096, one and three packed samples, an initial state.
TEST_F(CudaKernels, DeltaRuleMatchesTransformers) {
  for (const std::string& name : testing::delta_rule_cases()) {
    const testing::DeltaRuleCase c = testing::load_delta_rule_case(name);
    const at::Tensor state0 = c.initial_state.defined() ? c.initial_state : at::zeros_like(c.final_state);
    const cuda::DeltaRuleForward f = delta_forward({c.q, c.k, c.v, c.g, c.beta, state0, c.cu_seqlens}, 64);
    const double bound = c.q.size(0) > 1000 ? 2e-6 : 1e-6;
    EXPECT_EQ(f.out.device(), cuda::device()) << name;
    EXPECT_LT((f.out.cpu() - c.chunk).abs().max().item<double>(), bound) << name << ": chunked form";
    EXPECT_LT((f.out.cpu() - c.recurrent).abs().max().item<double>(), bound) << name << ": recurrent form";
    EXPECT_LT((f.final_state.cpu() - c.final_state).abs().max().item<double>(), bound)
        << name << ": final state";
  }
}

// Chunks of 64 (the checkpoints fall inside the 65-token samples) and of 7 (many checkpoints, spans
// of 3 recomputed tokens cut by chunk ends).
TEST_F(CudaKernels, DeltaRuleGradientsMatchTheComposite) {
  for (const int64_t chunk : {64, 7})
    for (const char* name : {"len1", "len63", "len64", "len65", "packed", "initial", "packed4096"}) {
      const testing::DeltaRuleCase c = testing::load_delta_rule_case(name);
      const at::Tensor state0 = c.initial_state.defined() ? c.initial_state : at::zeros_like(c.final_state);
      at::manual_seed(0);
      const at::Tensor dout = at::randn(c.v.sizes()), dfinal = at::randn(c.final_state.sizes());
      compare_delta_rule({c.q, c.k, c.v, c.g, c.beta, state0, c.cu_seqlens}, chunk, dout, dfinal,
                         std::string(name) + ", chunk " + std::to_string(chunk));
    }
}

// Heads wider than a block's threads in Dk (70 rows over 64 threads) and not a whole warp in Dv
// (40 columns), three value heads on one key head, empty segments first and in the middle, a
// given initial state; only the output's gradient, then only the final state's.
TEST_F(CudaKernels, DeltaRuleWideHeadsAndEmptySegments) {
  at::manual_seed(5);
  const std::vector<int64_t> cu{0, 0, 5, 5, 135};
  const int64_t tokens = cu.back(), hk = 1, hv = 3, dk = 70, dv = 40;
  const auto unit = [](const at::Tensor& t) { return t / t.norm(2, -1, true); };
  const DeltaRuleInputs x{unit(at::randn({tokens, hk, dk})),
                          unit(at::randn({tokens, hk, dk})),
                          at::randn({tokens, hv, dv}),
                          -at::softplus(at::randn({tokens, hv})) * 0.5,
                          at::sigmoid(at::randn({tokens, hv})),
                          at::randn({4, hv, dk, dv}) * 0.5,
                          cu};
  compare_delta_rule(x, 64, at::randn({tokens, hv, dv}), {}, "wide heads, output gradient");
  compare_delta_rule(x, 10, {}, at::randn({4, hv, dk, dv}), "wide heads, final-state gradient");
}

// The public entry points (flash_attention, rms_norm, swiglu, rotary) on tensors of device(): in a
// CUDA build they dispatch to the CUDA kernels, forward and backward through autograd; in a CPU
// build this runs the CPU kernels, which their own tests check too.
TEST_F(CudaKernels, PublicEntryPointsMatchTheCompositesOnTheDevice) {
  at::manual_seed(8);
  auto leaf = [](const at::Tensor& t) { return on_device(t).clone().set_requires_grad(true); };
  auto check = [](const at::Tensor& fused, const std::vector<at::Tensor>& inputs, const at::Tensor& reference,
                  const std::vector<at::Tensor>& reference_inputs, double tolerance,
                  const std::string& what) {
    EXPECT_EQ(fused.device(), cuda::device()) << what;
    expect_close(fused, reference, tolerance, what + ": forward");
    const at::Tensor grad = at::randn(reference.sizes());
    (fused.to(at::kFloat) * on_device(grad)).sum().backward();
    (reference.to(at::kFloat) * grad).sum().backward();
    for (size_t i = 0; i < inputs.size(); ++i)
      expect_close(inputs[i].grad(), reference_inputs[i].grad(), tolerance * 5,
                   what + ": gradient " + std::to_string(i));
  };
  {
    const at::Tensor q = at::randn({50, 4, 32}), k = at::randn({50, 2, 32}), v = at::randn({50, 2, 32});
    const at::Tensor qd = leaf(q), kd = leaf(k), vd = leaf(v);
    const at::Tensor qr = q.clone().set_requires_grad(true), kr = k.clone().set_requires_grad(true),
                     vr = v.clone().set_requires_grad(true);
    const std::vector<int64_t> cu{0, 20, 50};
    check(flash_attention(qd, kd, vd, cu, {true}), {qd, kd, vd}, composite_attention(qr, kr, vr, cu, {true}),
          {qr, kr, vr}, 1e-5, "flash_attention");
  }
  {
    const at::Tensor x = at::randn({6, 96}).to(at::kBFloat16), w = at::randn({96});
    const at::Tensor xd = leaf(x), wd = leaf(w);
    const at::Tensor xr = x.clone().set_requires_grad(true), wr = w.clone().set_requires_grad(true);
    check(rms_norm(xd, wd, 1e-6), {xd, wd}, rms_norm_composite(xr, wr, 1e-6), {xr, wr}, 2e-2, "rms_norm");
  }
  {
    const at::Tensor g = at::randn({7, 33}), u = at::randn({7, 33});
    const at::Tensor gd = leaf(g), ud = leaf(u);
    const at::Tensor gr = g.clone().set_requires_grad(true), ur = u.clone().set_requires_grad(true);
    check(swiglu(gd, ud), {gd, ud}, swiglu_composite(gr, ur), {gr, ur}, 1e-5, "swiglu");
  }
  {
    // Angles shared by a batch of 2 (broadcast over it) and the heads: (1, P, 1, D).
    const at::Tensor x = at::randn({2, 9, 3, 16}), angles = at::rand({1, 9, 1, 16}) * 6;
    const at::Tensor xd = leaf(x), xr = x.clone().set_requires_grad(true);
    check(rotary(xd, on_device(angles.cos()), on_device(angles.sin())), {xd},
          rotary_composite(xr, angles.cos(), angles.sin()), {xr}, 1e-5, "rotary");
  }
  {
    // bf16 inputs (the layer's dtype), computed in fp32 by both.
    const testing::DeltaRuleCase c = testing::load_delta_rule_case("packed");
    std::vector<at::Tensor> device_inputs, reference_inputs;
    for (const at::Tensor& t : {c.q, c.k, c.v, c.g, c.beta}) {
      device_inputs.push_back(leaf(t.to(at::kBFloat16)));
      reference_inputs.push_back(t.to(at::kBFloat16).clone().set_requires_grad(true));
    }
    const auto run = [&](const std::vector<at::Tensor>& x, auto rule) {
      return rule(x[0], x[1], x[2], x[3], x[4], c.cu_seqlens, at::Tensor(), DeltaRuleOptions{}).out;
    };
    check(run(device_inputs, delta_rule), device_inputs, run(reference_inputs, composite_delta_rule),
          reference_inputs, 2e-2, "delta_rule");
  }
}

}  // namespace
}  // namespace loom::kernels
