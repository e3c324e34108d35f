// What the tests against a reference implementation's run share: the fixture directory's raw
// little-endian float32 tensors and JSON files, the max abs difference of a comparison (printed, so a
// run shows how close each one is), and the message of an expected exception.
#pragma once
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>

namespace loom::testing {

class ReferenceFixture {
 public:
  // `dir` holds the files; `label` starts each printed comparison.
  ReferenceFixture(std::string dir, std::string label) : dir_(std::move(dir)), label_(std::move(label)) {}

  const std::string& dir() const { return dir_; }
  nlohmann::json json(const std::string& name) const {
    std::ifstream in(dir_ + "/" + name);
    EXPECT_TRUE(in.good()) << dir_ << "/" << name;
    return nlohmann::json::parse(in);
  }
  // The file's float32 values as a tensor of `shape` (a failure when it holds another count).
  at::Tensor f32(const std::string& name, at::IntArrayRef shape) const {
    std::ifstream in(dir_ + "/" + name, std::ios::binary);
    EXPECT_TRUE(in.good()) << dir_ << "/" << name;
    auto t = at::empty(shape, at::kFloat);
    in.read(reinterpret_cast<char*>(t.data_ptr<float>()),
            static_cast<std::streamsize>(t.numel() * sizeof(float)));
    EXPECT_EQ(in.gcount(), static_cast<std::streamsize>(t.numel() * sizeof(float))) << name;
    EXPECT_EQ(in.peek(), std::char_traits<char>::eof())
        << name << " holds more than " << t.numel() << " values";
    return t;
  }
  // max |actual - expected| in float64 (infinite, and a failure, when the shapes differ).
  double max_abs_diff(const std::string& what, const at::Tensor& actual, const at::Tensor& expected) const {
    EXPECT_EQ(actual.sizes(), expected.sizes()) << what;
    if (actual.sizes() != expected.sizes()) return INFINITY;
    const double diff = (actual.to(at::kDouble) - expected.to(at::kDouble)).abs().max().item<double>();
    std::printf("  %s %-32s max abs diff %.3g\n", label_.c_str(), what.c_str(), diff);
    return diff;
  }

 private:
  std::string dir_, label_;
};

// The message of the E that f throws; a failure (and "") when it throws none.
template <class E, class F>
std::string message_of(F&& f) {
  try {
    f();
  } catch (const E& e) {
    return e.what();
  }
  ADD_FAILURE() << "expected an exception";
  return "";
}

}  // namespace loom::testing
