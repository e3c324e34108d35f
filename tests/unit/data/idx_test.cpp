// IDX reader: hand-made byte fixtures (tests/fixtures/idx/make.py), plain and gzipped,
// and every way a file can be broken.
#include "loom/data/idx.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "data_test_util.h"
#include "loom/util/errors.h"

using namespace loom::data;
using loom::test::message_of;
using loom::test::says_all;

namespace {

std::string fixture(const std::string& name) {
  return std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/idx/" + name;
}

// Reads `name`, expecting a DataError whose message names the file and contains every one of `parts`.
void expect_read_error(const std::string& name, std::vector<std::string> parts) {
  parts.push_back(fixture(name));
  EXPECT_TRUE(says_all(message_of([&] { read_idx(fixture(name)); }), parts)) << name;
}

}  // namespace

TEST(Idx, ReadsPlainFile) {
  const IdxArray a = read_idx(fixture("u8_2x3.idx"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, (std::vector<uint8_t>{0, 1, 127, 128, 254, 255}));
}

TEST(Idx, ReadsGzippedFile) {
  const IdxArray a = read_idx(fixture("u8_2x3.idx.gz"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(a.data, (std::vector<uint8_t>{0, 1, 127, 128, 254, 255}));
}

TEST(Idx, ReadsBigEndianSizesAboveOneByte) {
  // First dimension 258 = 0x00000102: a little-endian reader would see 0x02010000.
  const IdxArray a = read_idx(fixture("u8_258x1x2.idx.gz"));
  EXPECT_EQ(a.dims, (std::vector<int64_t>{258, 1, 2}));
  ASSERT_EQ(a.data.size(), 516u);
  EXPECT_EQ(a.data[0], 0);
  EXPECT_EQ(a.data[1], 7);
  EXPECT_EQ(a.data[37], 3);    // 7 * 37 = 259 -> 3
  EXPECT_EQ(a.data[515], 21);  // 7 * 515 = 3605 = 14 * 256 + 21
}

TEST(Idx, MissingFileIsNamed) { expect_read_error("no_such_file.idx.gz", {"does not exist"}); }

TEST(Idx, BadMagic) {
  expect_read_error("bad_magic.idx", {"bad magic", "01 00 08 02", "00 00 <type> <dims>"});
}

TEST(Idx, OtherElementTypeIsNamed) { expect_read_error("float_type.idx", {"0x0d", "float", "0x08"}); }

TEST(Idx, ZeroDimensions) { expect_read_error("zero_dims.idx", {"0 dimensions"}); }

TEST(Idx, TruncatedHeader) {
  expect_read_error("short_header.idx", {"truncated", "expected 8 bytes", "found 2"});
}

TEST(Idx, TruncatedPayload) {
  expect_read_error("truncated.idx.gz", {"truncated", "[2, 3]", "6 payload bytes", "found 5"});
}

TEST(Idx, TrailingBytes) {
  expect_read_error("trailing.idx", {"2 bytes after the payload", "6 payload bytes"});
}

TEST(Idx, CorruptGzipStream) { expect_read_error("bad_crc.idx.gz", {"corrupt", "incorrect data check"}); }
