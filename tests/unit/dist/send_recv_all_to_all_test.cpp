// Comm's point-to-point and all-to-all across real processes: these tests run as 4 ranks under
// `loom run -n 4` (tests/e2e/parallel_state.sh); alone they are skipped. Rank r sends values built
// from r, so what each rank receives has a closed form: a ring of sends in every dtype Loom trains
// in (fp32, bf16, fp16, int64), several messages in flight under different tags, non-contiguous
// tensors on both ends, blocking sends and receives in pairs, and all-to-alls with unequal splits
// (rows of every dtype, a rank that receives nothing, the started form), and the argument errors.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "loom/util/errors.h"
#include "loom_run_world.h"

namespace loom::dist {
namespace {

constexpr int64_t kRanks = 4;

// What rank `from` sends: [[0, 1, 2], [3, 4, 5]] + 10 * from, exact in every dtype.
at::Tensor ring_message(int64_t from, at::ScalarType dtype) {
  return (at::arange(6, at::kFloat).view({2, 3}) + 10.0 * static_cast<double>(from)).to(dtype);
}

// The message of error `e` contains `part`.
void expect_error(const std::function<void()>& call, const std::string& part) {
  try {
    call();
    ADD_FAILURE() << "expected a DistributedError containing: " << part;
  } catch (const DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
  }
}

TEST(SendRecvUnderLoomRun, MessagesArriveWithTheirClosedForms) {
  const auto comm = loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_dist_tests";
  const int64_t r = comm->rank(), next = (r + 1) % kRanks, previous = (r + kRanks - 1) % kRanks;

  // A ring, in every dtype: each rank sends to the next and receives from the previous one.
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    at::Tensor received = at::empty({2, 3}, dtype);
    auto sending = comm->start_send(ring_message(r, dtype), next, 0);
    auto receiving = comm->start_recv(received, previous, 0);
    receiving->wait();
    sending->wait();
    EXPECT_TRUE(received.equal(ring_message(previous, dtype))) << c10::toString(dtype);
  }

  // Several messages in flight around the ring at once, one per tag, each of its own length and
  // dtype, received in the reverse order of their sends: each is matched by its tag.
  {
    const std::vector<at::ScalarType> dtypes{at::kFloat, at::kBFloat16, at::kHalf, at::kLong};
    auto message = [](int64_t from, int64_t tag, at::ScalarType dtype) {
      return at::full({tag + 1}, static_cast<double>(10 * tag + from), dtype);
    };
    std::vector<std::unique_ptr<PendingWork>> sends, receives;
    std::vector<at::Tensor> received(dtypes.size());
    for (int64_t tag = 0; tag < static_cast<int64_t>(dtypes.size()); ++tag)
      sends.push_back(comm->start_send(message(r, tag, dtypes[tag]), next, tag));
    for (int64_t tag = static_cast<int64_t>(dtypes.size()) - 1; tag >= 0; --tag) {
      received[tag] = at::empty({tag + 1}, dtypes[tag]);
      receives.push_back(comm->start_recv(received[tag], previous, tag));
    }
    for (auto& work : receives) work->wait();
    for (auto& work : sends) work->wait();
    for (int64_t tag = 0; tag < static_cast<int64_t>(dtypes.size()); ++tag)
      EXPECT_TRUE(received[tag].equal(message(previous, tag, dtypes[tag]))) << "tag " << tag;
  }

  // Non-contiguous on both ends: a transposed tensor is sent; the receive lands in two columns of a
  // wider tensor, whose other columns stay as they were.
  {
    at::Tensor wide = at::zeros({3, 4}, at::kFloat);
    at::Tensor columns = wide.narrow(1, 1, 2);
    ASSERT_FALSE(columns.is_contiguous());
    auto sending = comm->start_send(ring_message(r, at::kFloat).t(), next, 5);
    auto receiving = comm->start_recv(columns, previous, 5);
    receiving->wait();
    sending->wait();
    EXPECT_TRUE(columns.equal(ring_message(previous, at::kFloat).t()));
    EXPECT_TRUE(wide.narrow(1, 0, 1).equal(at::zeros({3, 1})));
    EXPECT_TRUE(wide.narrow(1, 3, 1).equal(at::zeros({3, 1})));
  }

  // Blocking, in pairs (0, 1) and (2, 3): the even rank sends first, the odd one receives first.
  {
    const int64_t partner = r ^ 1;
    at::Tensor received = at::empty({2, 3}, at::kLong);
    if (r % 2 == 0) {
      comm->send(ring_message(r, at::kLong), partner, 3);
      comm->recv(received, partner, 3);
    } else {
      comm->recv(received, partner, 3);
      comm->send(ring_message(r, at::kLong), partner, 3);
    }
    EXPECT_TRUE(received.equal(ring_message(partner, at::kLong)));
  }

  // The peer must be another rank of the group; the tag must fit Gloo's.
  const std::string self = "rank " + std::to_string(r) + ": ";
  at::Tensor t = at::zeros({1});
  expect_error([&] { comm->start_send(t, r, 0); },
               self + "send to rank " + std::to_string(r) +
                   " of group world: the peer must be another of its ranks 0 to 3 (this one is " +
                   std::to_string(r) + ")");
  expect_error([&] { comm->start_recv(t, kRanks, 0); },
               self + "receive from rank 4 of group world: the peer must be another of its ranks 0 to 3");
  expect_error([&] { comm->start_send(t, next, -1); },
               self + "send to rank " + std::to_string(next) + " with tag -1: tags are 0 to 2147483647");
  comm->barrier();
}

// Rank `from`'s rows for rank `to`: (to + 1) rows of two values, row k holding
// 20 * from + 4 * to + k and that plus 100 (at most 175: exact in every dtype).
at::Tensor rows_for(int64_t from, int64_t to, at::ScalarType dtype) {
  const auto k = at::arange(to + 1, at::kFloat).view({to + 1, 1});
  return (at::cat({k, k + 100}, 1) + static_cast<double>(20 * from + 4 * to)).to(dtype);
}

std::string joined(const std::vector<int64_t>& values) {
  std::string out;
  for (const int64_t v : values) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

TEST(AllToAllUnderLoomRun, UnequalSplitsHaveTheirClosedForms) {
  const auto comm = loom_run_world();
  if (!comm) GTEST_SKIP() << "needs 4 ranks: loom run -n 4 -- loom_dist_tests";
  const int64_t r = comm->rank();

  // Rank r sends j + 1 rows to rank j, so it receives r + 1 rows from every rank.
  const std::vector<int64_t> input_splits{1, 2, 3, 4};
  const std::vector<int64_t> output_splits(kRanks, r + 1);
  auto input_of = [&](int64_t from, at::ScalarType dtype) {
    std::vector<at::Tensor> blocks;
    for (int64_t to = 0; to < kRanks; ++to) blocks.push_back(rows_for(from, to, dtype));
    return at::cat(blocks);
  };
  auto expected = [&](at::ScalarType dtype) {
    std::vector<at::Tensor> blocks;
    for (int64_t from = 0; from < kRanks; ++from) blocks.push_back(rows_for(from, r, dtype));
    return at::cat(blocks);
  };
  for (const auto dtype : {at::kFloat, at::kBFloat16, at::kHalf, at::kLong}) {
    at::Tensor output = at::empty({kRanks * (r + 1), 2}, dtype);
    comm->all_to_all(input_of(r, dtype), output, output_splits, input_splits);
    EXPECT_TRUE(output.equal(expected(dtype))) << c10::toString(dtype);
    at::Tensor started = at::empty_like(output);
    comm->start_all_to_all(input_of(r, dtype), started, output_splits, input_splits)->wait();
    EXPECT_TRUE(started.equal(output)) << c10::toString(dtype);
  }

  // Non-contiguous input (a transposed tensor) and output (two columns of a wider tensor), and a
  // rank receiving no rows: every rank sends one row to each rank but 0. Ranks 1-3 receive one row
  // from each rank, 10 * from + [0, 1].
  {
    const std::vector<int64_t> sends{0, 1, 1, 1};
    const std::vector<int64_t> receives(kRanks, r == 0 ? 0 : 1);
    const at::Tensor input = (at::arange(2, at::kFloat).view({2, 1}) + 10.0 * r).expand({2, 3}).t();
    ASSERT_FALSE(input.is_contiguous());
    at::Tensor wide = at::zeros({r == 0 ? 0 : kRanks, 4});
    at::Tensor output = wide.narrow(1, 1, 2);
    comm->all_to_all(input, output, receives, sends);
    if (r != 0) {
      ASSERT_FALSE(output.is_contiguous());
      EXPECT_TRUE(output.equal(at::arange(kRanks, at::kFloat).mul(10).view({kRanks, 1}) +
                               at::arange(2, at::kFloat).view({1, 2})));
      EXPECT_TRUE(wide.narrow(1, 0, 1).equal(at::zeros({kRanks, 1})));
    }
  }

  // Splits that do not describe the tensors are refused before anything is sent.
  const std::string self = "rank " + std::to_string(r) + ": all-to-all of a [10, 2] Float input split ";
  at::Tensor output = at::empty({kRanks * (r + 1), 2});
  expect_error(
      [&] {
        comm->all_to_all(input_of(r, at::kFloat), output, output_splits, {1, 2, 3, 5});
      },
      self + "[1, 2, 3, 5] into a [" + std::to_string(kRanks * (r + 1)) + ", 2] Float output split [" +
          joined(output_splits) + "]: the input's split sums to 11 rows, not its 10");
  expect_error(
      [&] {
        comm->all_to_all(input_of(r, at::kFloat), output, output_splits, {1, 2, 7});
      },
      "each split needs 4 entries, one per rank of the group");
  at::Tensor narrow_rows = at::empty({kRanks * (r + 1), 3});
  expect_error([&] { comm->all_to_all(input_of(r, at::kFloat), narrow_rows, output_splits, input_splits); },
               "their rows differ in shape or dtype");
  comm->barrier();
}

}  // namespace
}  // namespace loom::dist
