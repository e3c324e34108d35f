// The fused RMSNorm, LayerNorm, SwiGLU and rotary kernels against their composite forms (autograd through
// ATen's ops): outputs and every gradient, fp32 and bf16, on shapes whose row counts and widths are
// not multiples of a vector width or of the rows given to one thread; the rotary backward also
// against the closed-form inverse rotation; and bad shapes.
#include "loom/kernels/pointwise.h"

#include <ATen/Parallel.h>
#include <gtest/gtest.h>

#include "loom/util/errors.h"

namespace loom::kernels {
namespace {

at::Tensor leaf(at::IntArrayRef shape, at::ScalarType dtype, double scale = 1.0) {
  return (at::randn(shape) * scale).to(dtype).set_requires_grad(true);
}

at::Tensor clone_leaf(const at::Tensor& t) { return t.detach().clone().set_requires_grad(true); }

void expect_close(const at::Tensor& got, const at::Tensor& want, double tolerance, const std::string& what) {
  ASSERT_EQ(got.sizes(), want.sizes()) << what;
  ASSERT_EQ(got.scalar_type(), want.scalar_type()) << what;
  const double error = (got.to(at::kFloat) - want.to(at::kFloat)).abs().max().item<double>();
  const double scale = std::max(1.0, want.to(at::kFloat).abs().max().item<double>());
  EXPECT_LE(error, tolerance * scale) << what << ": max error " << error;
}

double tolerance_of(at::ScalarType dtype) { return dtype == at::kBFloat16 ? 2e-2 : 2e-5; }

TEST(FusedKernels, RmsNormMatchesTheComposite) {
  at::manual_seed(1);
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (auto shape :
         {std::vector<int64_t>{3, 37, 64}, std::vector<int64_t>{1, 129}, std::vector<int64_t>{70, 17}}) {
      const std::string what = fmt::format("[{}] {}", fmt::join(shape, ","), c10::toString(dtype));
      auto x = leaf(shape, dtype, 3.0),
           w = (at::rand({shape.back()}) + 0.5).to(dtype).set_requires_grad(true);
      auto x2 = clone_leaf(x), w2 = clone_leaf(w);
      const auto grad = at::randn(shape).to(dtype);
      auto y = rms_norm(x, w, 1e-6), ref = rms_norm_composite(x2, w2, 1e-6);
      expect_close(y, ref, dtype == at::kBFloat16 ? 1e-2 : 1e-6, what + " output");
      y.backward(grad);
      ref.backward(grad);
      expect_close(x.grad(), x2.grad(), tolerance_of(dtype), what + " dx");
      expect_close(w.grad(), w2.grad(), tolerance_of(dtype) * 5, what + " dweight");
    }
}

TEST(FusedKernels, RmsNormWeightGradientDoesNotDependOnThreads) {
  // The weight gradient sums per-thread partials: one thread and several give the same value.
  at::manual_seed(2);
  auto x = leaf({300, 48}, at::kFloat), w = leaf({48}, at::kFloat);
  const auto grad = at::randn({300, 48});
  const int threads = at::get_num_threads();
  at::set_num_threads(1);
  rms_norm(x, w, 1e-6).backward(grad);
  const auto one = w.grad().clone();
  w.mutable_grad().reset();
  at::set_num_threads(std::max(2, threads));
  rms_norm(x, w, 1e-6).backward(grad);
  at::set_num_threads(threads);
  expect_close(w.grad(), one, 1e-6, "threads");
}

TEST(FusedKernels, LayerNormMatchesTheCompositeAndAten) {
  at::manual_seed(8);
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (auto shape :
         {std::vector<int64_t>{3, 37, 64}, std::vector<int64_t>{1, 129}, std::vector<int64_t>{70, 17}}) {
      const std::string what = fmt::format("[{}] {}", fmt::join(shape, ","), c10::toString(dtype));
      auto x = (leaf(shape, at::kFloat, 3.0).detach() + 1.5).to(dtype).set_requires_grad(true);
      auto w = (at::rand({shape.back()}) + 0.5).to(dtype).set_requires_grad(true);
      auto b = at::randn({shape.back()}).to(dtype).set_requires_grad(true);
      auto x2 = clone_leaf(x), w2 = clone_leaf(w), b2 = clone_leaf(b);
      const auto grad = at::randn(shape).to(dtype);
      auto y = layer_norm(x, w, b, 1e-6), ref = layer_norm_composite(x2, w2, b2, 1e-6);
      expect_close(y, ref, dtype == at::kBFloat16 ? 1e-2 : 1e-5, what + " output");
      if (dtype == at::kFloat)
        expect_close(y, at::layer_norm(x.detach(), {shape.back()}, w.detach(), b.detach(), 1e-6), 1e-5,
                     what + " against at::layer_norm");
      y.backward(grad);
      ref.backward(grad);
      expect_close(x.grad(), x2.grad(), tolerance_of(dtype), what + " dx");
      expect_close(w.grad(), w2.grad(), tolerance_of(dtype) * 5, what + " dweight");
      expect_close(b.grad(), b2.grad(), tolerance_of(dtype) * 5, what + " dbias");
    }
}

TEST(FusedKernels, SwigluMatchesTheComposite) {
  at::manual_seed(3);
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (auto shape : {std::vector<int64_t>{5, 33}, std::vector<int64_t>{2, 300, 129}}) {
      const std::string what = fmt::format("[{}] {}", fmt::join(shape, ","), c10::toString(dtype));
      auto g = leaf(shape, dtype, 4.0), u = leaf(shape, dtype);
      auto g2 = clone_leaf(g), u2 = clone_leaf(u);
      const auto grad = at::randn(shape).to(dtype);
      auto y = swiglu(g, u), ref = swiglu_composite(g2, u2);
      expect_close(y, ref, dtype == at::kBFloat16 ? 1e-2 : 1e-6, what + " output");
      y.backward(grad);
      ref.backward(grad);
      expect_close(g.grad(), g2.grad(), tolerance_of(dtype), what + " d gate");
      expect_close(u.grad(), u2.grad(), tolerance_of(dtype), what + " d up");
    }
  EXPECT_THROW(swiglu(at::ones({2, 3}), at::ones({3, 2})), ModelError);
}

// Angles with the halves duplicated (as M-RoPE and the vision RoPE build them) and, for the
// general case, distinct halves.
std::pair<at::Tensor, at::Tensor> angles(std::vector<int64_t> shape, bool duplicated) {
  shape.back() /= 2;
  auto half = at::rand(shape) * 6.0;
  auto a = duplicated ? at::cat({half, half}, -1) : at::cat({half, at::rand(shape) * 6.0}, -1);
  return {a.cos(), a.sin()};
}

TEST(FusedKernels, RotaryMatchesTheComposite) {
  at::manual_seed(4);
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (bool duplicated : {true, false}) {
      // Text: x (B, L, H, D) with angles (B, L, 1, D); vision: x (N, H, D) with angles (N, 1, D).
      for (auto shape : {std::vector<int64_t>{2, 19, 3, 16}, std::vector<int64_t>{37, 2, 8}}) {
        const std::string what =
            fmt::format("[{}] {} duplicated {}", fmt::join(shape, ","), c10::toString(dtype), duplicated);
        std::vector<int64_t> angle_shape = shape;
        angle_shape[angle_shape.size() - 2] = 1;
        const auto [cos, sin] = angles(angle_shape, duplicated);
        auto x = leaf(shape, dtype), x2 = clone_leaf(x);
        const auto grad = at::randn(shape).to(dtype);
        auto y = rotary(x, cos, sin), ref = rotary_composite(x2, cos, sin);
        expect_close(y, ref, dtype == at::kBFloat16 ? 1e-2 : 1e-6, what + " output");
        y.backward(grad);
        ref.backward(grad);
        expect_close(x.grad(), x2.grad(), tolerance_of(dtype), what + " dx");
        if (duplicated && dtype == at::kFloat) {
          // A rotation's transpose is the rotation by -angle.
          expect_close(x.grad(), rotary_composite(grad, cos, -sin), 1e-6, what + " inverse rotation");
        }
      }
    }
  EXPECT_THROW(rotary(at::ones({4, 2, 8}), at::ones({3, 1, 8}), at::ones({3, 1, 8})), std::exception);
}

}  // namespace
}  // namespace loom::kernels
