#include "loom/train/tensorboard.h"

#include <gtest/gtest.h>

#include <cstring>

#include "../checkpoint/temp_dir.h"
#include "loom/train/metrics.h"

namespace loom::train {
namespace {

namespace fs = std::filesystem;
using checkpoint::testing::read_bytes;
using checkpoint::testing::TempDir;

std::string bytes(std::initializer_list<int> values) {
  std::string out;
  for (const int v : values) out += static_cast<char>(v);
  return out;
}

uint32_t little_endian_u32(const std::string& data, size_t at) {
  uint32_t value = 0;
  for (int i = 3; i >= 0; --i) value = value << 8 | static_cast<uint8_t>(data[at + i]);
  return value;
}

// The data of each TFRecord in `file`, checking the framing and both CRCs on the way.
std::vector<std::string> read_records(const fs::path& file) {
  const std::string data = read_bytes(file.string());
  std::vector<std::string> records;
  for (size_t at = 0; at < data.size();) {
    EXPECT_LE(at + 12, data.size());
    uint64_t length = 0;
    for (int i = 7; i >= 0; --i) length = length << 8 | static_cast<uint8_t>(data[at + i]);
    EXPECT_EQ(little_endian_u32(data, at + 8), masked_crc32c(data.data() + at, 8));
    EXPECT_LE(at + 12 + length + 4, data.size());
    records.push_back(data.substr(at + 12, length));
    EXPECT_EQ(little_endian_u32(data, at + 12 + length), masked_crc32c(records.back().data(), length));
    at += 12 + length + 4;
  }
  return records;
}

TEST(Crc32c, KnownVectors) {
  // "123456789" is the check value of the CRC catalogues; the 32-byte ones are RFC 3720's (B.4).
  EXPECT_EQ(crc32c("123456789", 9), 0xE3069283u);
  EXPECT_EQ(crc32c("", 0), 0u);
  const std::string zeros(32, '\0'), ones(32, '\xff');
  std::string ascending;
  for (int i = 0; i < 32; ++i) ascending += static_cast<char>(i);
  EXPECT_EQ(crc32c(zeros.data(), zeros.size()), 0x8A9136AAu);
  EXPECT_EQ(crc32c(ones.data(), ones.size()), 0x62A8AB43u);
  EXPECT_EQ(crc32c(ascending.data(), ascending.size()), 0x46DD794Eu);
  // ((0xE3069283 >> 15) | (0xE3069283 << 17)) + 0xa282ead8, modulo 2^32.
  EXPECT_EQ(masked_crc32c("123456789", 9), 0xC78AB0E5u);
}

TEST(TfRecord, LengthCrcDataCrc) {
  const std::string record = tfrecord("abc");
  ASSERT_EQ(record.size(), 8u + 4 + 3 + 4);
  EXPECT_EQ(record.substr(0, 8), bytes({3, 0, 0, 0, 0, 0, 0, 0}));
  EXPECT_EQ(little_endian_u32(record, 8), masked_crc32c(record.data(), 8));
  EXPECT_EQ(record.substr(12, 3), "abc");
  EXPECT_EQ(little_endian_u32(record, 15), masked_crc32c("abc", 3));
}

TEST(EventEncoding, ScalarsByteForByte) {
  // Event{wall_time: 1.0 (field 1, fixed64), step: 3 (field 2, varint), summary (field 5) {
  //   value (field 1) {tag: "a" (field 1), simple_value: 0.5f (field 2, fixed32)}}}
  EXPECT_EQ(encode_scalars_event(1.0, 3, {{"a", 0.5}}),
            bytes({0x09, 0,    0,    0,    0,    0,   0,    0xF0, 0x3F, 0x10, 0x03, 0x2A,
                   0x0A, 0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0,    0,    0,    0x3F}));
  // A step of 300 takes two varint bytes (0xAC 0x02); two values follow each other.
  const std::string two = encode_scalars_event(0.0, 300, {{"a", 0.5}, {"b", -2.0}});
  EXPECT_EQ(two.substr(9), bytes({0x10, 0xAC, 0x02, 0x2A, 0x14, 0x0A, 0x08, 0x0A, 0x01, 'a', 0x15, 0,   0,
                                  0,    0x3F, 0x0A, 0x08, 0x0A, 0x01, 'b',  0x15, 0,    0,   0,    0xC0}));
}

TEST(EventEncoding, FileVersion) {
  EXPECT_EQ(encode_file_version_event(0.0, "brain.Event:2"),
            bytes({0x09, 0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0x00, 0x1A, 13}) + "brain.Event:2");
}

TEST(TensorBoardWriter, OneEventPerRecordWithAStep) {
  TempDir dir;
  fs::path path;
  {
    TensorBoardWriter writer(dir.path() / "tb");
    path = writer.path();
    writer.write({{"step", 2}, {"loss", 1.5}, {"final", true}, {"name", "x"}, {"lr", 0.25}});
    writer.write({{"loss", 9.0}});  // no step: not written
    writer.write({{"step", 4}, {"eval_accuracy", 0.75}});
    // A list of numbers (each expert's tokens): one scalar per entry.
    writer.write({{"step", 5}, {"expert_tokens", {3.0, 0.0, 7.0}}, {"tags", {"a", "b"}}});
    // Flushed as written: readable while the writer is open.
    EXPECT_EQ(read_records(path).size(), 4u);
  }
  EXPECT_EQ(path.parent_path(), dir.path() / "tb");
  const std::string name = path.filename().string();
  EXPECT_EQ(name.rfind("events.out.tfevents.", 0), 0u) << name;
  EXPECT_EQ(name.substr(name.size() - 5), ".loom") << name;

  const auto records = read_records(path);
  ASSERT_EQ(records.size(), 4u);
  // After each event's 9-byte wall time: the rest as encoded, numbers only (JSON keys sorted).
  EXPECT_EQ(records[0].substr(9), encode_file_version_event(0, "brain.Event:2").substr(9));
  EXPECT_EQ(records[1].substr(9), encode_scalars_event(0, 2, {{"loss", 1.5}, {"lr", 0.25}}).substr(9));
  EXPECT_EQ(records[2].substr(9), encode_scalars_event(0, 4, {{"eval_accuracy", 0.75}}).substr(9));
  EXPECT_EQ(records[3].substr(9),
            encode_scalars_event(
                0, 5, {{"expert_tokens/0", 3.0}, {"expert_tokens/1", 0.0}, {"expert_tokens/2", 7.0}})
                .substr(9));
  double wall_time = 0;
  std::memcpy(&wall_time, records[1].data() + 1, 8);  // little-endian hosts
  EXPECT_GT(wall_time, 1.6e9);                        // seconds since 1970, after 2020
}

TEST(TensorBoardWriter, MetricsLogMirrorsEveryRecordToANewFilePerRun) {
  TempDir dir;
  std::optional<fs::path> first;
  {
    MetricsLog log(dir.path(), std::nullopt, dir.path() / "tensorboard");
    first = log.tensorboard_path();
    ASSERT_TRUE(first);
    log.write({{"step", 1}, {"loss", 2.0}});
    log.write({{"step", 2}, {"loss", 1.0}});
  }
  EXPECT_EQ(read_records(*first).size(), 3u);
  {
    MetricsLog resumed(dir.path(), 1, dir.path() / "tensorboard");  // most likely within the same second
    ASSERT_TRUE(resumed.tensorboard_path());
    EXPECT_NE(*resumed.tensorboard_path(), *first);
    resumed.write({{"step", 2}, {"loss", 1.25}});
    EXPECT_EQ(read_records(*resumed.tensorboard_path()).size(), 2u);
  }
  EXPECT_EQ(read_records(*first).size(), 3u);                  // the earlier run's file is kept
  EXPECT_FALSE(MetricsLog(dir.path(), 1).tensorboard_path());  // off unless asked
}

}  // namespace
}  // namespace loom::train
