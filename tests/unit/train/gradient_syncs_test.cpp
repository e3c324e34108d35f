// The composed gradient sync calls its parts' hooks in order (releases and reshards in reverse), and its clip
// scales every part's gradients by one norm, the root of the parts' summed squares; gradient_square
// weights and groups each parameter's squares as its NormShare says.
#include "loom/train/gradient_syncs.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "loom/util/errors.h"
#include "one_process_group.h"

namespace loom::train {
namespace {

// A part that writes each hook's call into a shared log and holds a squared norm of `square`.
class Recorder : public SyncPart {
 public:
  Recorder(std::string name, std::vector<std::string>& log, double square)
      : name_(std::move(name)), log_(log), square_(square) {}
  void begin_pass() override { log_.push_back("begin " + name_); }
  double end_pass() override {
    log_.push_back("end " + name_);
    return 1.0;
  }
  void before_backward(bool last) override { log_.push_back("backward " + name_ + (last ? " last" : "")); }
  double gradient_square() override { return square_; }
  void clip_to(double norm, double max_norm) override {
    log_.push_back("clip " + name_ + " " + std::to_string(norm) + " " + std::to_string(max_norm));
  }
  void gather() override { log_.push_back("gather " + name_); }
  void release() override { log_.push_back("release " + name_); }
  void reshard() override { log_.push_back("reshard " + name_); }

 private:
  std::string name_;
  std::vector<std::string>& log_;
  double square_;
};

TEST(ComposedSync, HooksRunInThePartsOrderAndReleaseAndReshardInReverse) {
  std::vector<std::string> log;
  ComposedSync sync(nullptr, {}, {}, {});
  sync.add(std::make_shared<Recorder>("a", log, 9.0));
  sync.add(std::make_shared<Recorder>("b", log, 0.0));
  sync.add(std::make_shared<Recorder>("c", log, 16.0));
  sync.begin_pass();
  sync.before_backward(true);
  EXPECT_EQ(sync.end_pass(), 3.0);  // every part's wait
  EXPECT_EQ(sync.clip(2.0), 5.0);   // sqrt(9 + 0 + 16)
  sync.gather_parameters();
  sync.reshard_from_parameters();
  sync.release_parameters();
  const std::string norm = std::to_string(5.0) + " " + std::to_string(2.0);
  const std::vector<std::string> expected{
      "begin a",   "begin b",   "begin c",  "backward a last", "backward b last", "backward c last",
      "end a",     "end b",     "end c",    "clip a " + norm,  "clip b " + norm,  "clip c " + norm,
      "gather a",  "gather b",  "gather c", "reshard c",       "reshard b",       "reshard a",
      "release c", "release b", "release a"};
  EXPECT_EQ(log, expected);
}

TEST(ComposedSync, OneProcessMakesItsOwnPassesAndCountsItsOwnTotal) {
  ComposedSync sync(nullptr, {}, {}, {});
  const auto [passes, total] = sync.passes_and_total(3, 7.5);
  EXPECT_EQ(passes, 3u);
  EXPECT_EQ(total, 7.5);
}

at::Tensor with_grad(const std::vector<float>& grad) {
  at::Tensor p = at::zeros({static_cast<int64_t>(grad.size())}).set_requires_grad(true);
  p.mutable_grad() = at::tensor(grad);
  return p;
}

TEST(GradientSquare, EachParameterCountsItsWeightOverItsGroupAndUncountedOnesNot) {
  // Over a group of one rank, a sum over the group is the rank's own: the closed form is
  // 3^2 + 4^2 (whole) + 0.5 * 12^2 (a slice two ranks hold alike) + 2^2 (an expert slice), and the
  // uncounted copy's 100^2 is left out.
  const auto tp = testing::one_process_group();
  const auto ep = testing::one_process_group();
  const std::vector<at::Tensor> params{with_grad({3, 4}), with_grad({12}), with_grad({2}), with_grad({100}),
                                       at::zeros({1})};
  std::vector<NormShare> shares(5);
  shares[1] = {tp, 0.5, true};
  shares[2] = {ep, 1.0, true};
  shares[3].counted = false;
  EXPECT_DOUBLE_EQ(gradient_square(params, shares, nullptr), 9.0 + 16.0 + 72.0 + 4.0);
  EXPECT_DOUBLE_EQ(gradient_square(params, shares, tp.get()), 101.0);  // the stages' sum: this one's
  EXPECT_DOUBLE_EQ(gradient_square(params, {}, nullptr), 9.0 + 16.0 + 144.0 + 4.0 + 10000.0);
  // Clipping to the norm scales every gradient, the uncounted copy's too.
  clip_gradients_to(params, std::sqrt(101.0), std::sqrt(101.0) / 2);
  const double scale = (std::sqrt(101.0) / 2) / (std::sqrt(101.0) + 1e-6);
  EXPECT_NEAR(params[3].grad().item<float>(), 100.0 * scale, 1e-4);
  EXPECT_NEAR(params[0].grad()[1].item<float>(), 4.0 * scale, 1e-6);
}

TEST(PipelineAndExpertParts, RefuseStepsTheirSchedulesCannotTake) {
  const PipelineGradients interleaved(nullptr, false, 2);
  EXPECT_TRUE(interleaved.pairs_passes());
  EXPECT_NO_THROW(interleaved.check_passes({2, 4}));
  EXPECT_THROW(interleaved.check_passes({2, 3}), ConfigError);
  EXPECT_FALSE(PipelineGradients(nullptr, false, 1).pairs_passes());
  const ExpertSlices experts(2, {});
  EXPECT_TRUE(experts.pairs_passes());
  EXPECT_NO_THROW(experts.check_passes({3, 3}));
  try {
    experts.check_passes({3, 2});
    FAIL() << "unequal passes under ep";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("data rank 0 has 3 micro-batches and rank 1 has 2"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace loom::train
