#include "loom/train/tensorboard.h"

#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <system_error>

#include "loom/util/errors.h"

namespace loom::train {

namespace fs = std::filesystem;

namespace {

// Table for the byte-at-a-time CRC-32C: entry b is the CRC register after shifting in byte b.
std::array<uint32_t, 256> crc32c_table() {
  std::array<uint32_t, 256> table{};
  for (uint32_t b = 0; b < 256; ++b) {
    uint32_t crc = b;
    for (int bit = 0; bit < 8; ++bit) crc = (crc >> 1) ^ ((crc & 1) ? 0x82F63B78u : 0u);
    table[b] = crc;
  }
  return table;
}

// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/): each field is a varint
// key (field number << 3 | wire type) followed by its value.
enum WireType : uint32_t { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

void put_varint(std::string& out, uint64_t value) {
  while (value >= 0x80) {
    out += static_cast<char>((value & 0x7F) | 0x80);
    value >>= 7;
  }
  out += static_cast<char>(value);
}

void put_little_endian(std::string& out, uint64_t value, int bytes) {
  for (int i = 0; i < bytes; ++i) out += static_cast<char>((value >> (8 * i)) & 0xFF);
}

void put_key(std::string& out, uint32_t field, WireType type) { put_varint(out, field << 3 | type); }

void put_double(std::string& out, uint32_t field, double value) {
  uint64_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed64);
  put_little_endian(out, bits, 8);
}

void put_float(std::string& out, uint32_t field, float value) {
  uint32_t bits;
  std::memcpy(&bits, &value, sizeof bits);
  put_key(out, field, kFixed32);
  put_little_endian(out, bits, 4);
}

void put_int64(std::string& out, uint32_t field, int64_t value) {
  put_key(out, field, kVarint);
  put_varint(out, static_cast<uint64_t>(value));  // a negative int64 takes ten bytes, as protobuf writes it
}

void put_bytes(std::string& out, uint32_t field, const std::string& bytes) {
  put_key(out, field, kLengthDelimited);
  put_varint(out, bytes.size());
  out += bytes;
}

// event.proto: Event { double wall_time = 1; int64 step = 2; oneof what { string file_version = 3;
// Summary summary = 5; ... } }. summary.proto: Summary { repeated Value value = 1; }
// Summary.Value { string tag = 1; oneof value { float simple_value = 2; ... } }.
namespace event_field {
constexpr uint32_t wall_time = 1, step = 2, file_version = 3, summary = 5;
}
namespace summary_field {
constexpr uint32_t value = 1;
}
namespace value_field {
constexpr uint32_t tag = 1, simple_value = 2;
}

double unix_seconds_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "localhost";
  return name;
}

}  // namespace

uint32_t crc32c(const void* data, size_t size) {
  static const std::array<uint32_t, 256> table = crc32c_table();
  const auto* bytes = static_cast<const uint8_t*>(data);
  uint32_t crc = 0xFFFFFFFFu;
  for (size_t i = 0; i < size; ++i) crc = (crc >> 8) ^ table[(crc ^ bytes[i]) & 0xFF];
  return crc ^ 0xFFFFFFFFu;
}

uint32_t masked_crc32c(const void* data, size_t size) {
  const uint32_t crc = crc32c(data, size);
  return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

std::string tfrecord(const std::string& data) {
  std::string length;
  put_little_endian(length, data.size(), 8);
  std::string record = length;
  put_little_endian(record, masked_crc32c(length.data(), length.size()), 4);
  record += data;
  put_little_endian(record, masked_crc32c(data.data(), data.size()), 4);
  return record;
}

std::string encode_file_version_event(double wall_time, const std::string& file_version) {
  std::string event;
  put_double(event, event_field::wall_time, wall_time);
  put_int64(event, event_field::step, 0);
  put_bytes(event, event_field::file_version, file_version);
  return event;
}

std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars) {
  std::string summary;
  for (const auto& [tag, value] : scalars) {
    std::string entry;
    put_bytes(entry, value_field::tag, tag);
    put_float(entry, value_field::simple_value, static_cast<float>(value));
    put_bytes(summary, summary_field::value, entry);
  }
  std::string event;
  put_double(event, event_field::wall_time, wall_time);
  put_int64(event, event_field::step, step);
  put_bytes(event, event_field::summary, summary);
  return event;
}

TensorBoardWriter::TensorBoardWriter(const fs::path& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw ConfigError(fmt::format("tools.tensorboard: cannot create {}: {}", dir.string(), ec.message()));
  const double now = unix_seconds_now();
  const std::string stem = fmt::format("events.out.tfevents.{}.{}.{}", static_cast<int64_t>(now), host_name(),
                                       static_cast<int64_t>(getpid()));
  path_ = dir / (stem + ".loom");
  for (int n = 1; fs::exists(path_); ++n) path_ = dir / fmt::format("{}.{}.loom", stem, n);  // same second
  out_.open(path_, std::ios::binary | std::ios::trunc);
  if (!out_) throw ConfigError(fmt::format("tools.tensorboard: cannot create {}", path_.string()));
  write_record(encode_file_version_event(now, "brain.Event:2"));
}

void TensorBoardWriter::write(const nlohmann::json& record) {
  const auto step = record.find("step");
  if (step == record.end() || !step->is_number()) return;
  std::vector<std::pair<std::string, double>> scalars;
  for (const auto& [name, value] : record.items()) {
    if (name == "step") continue;
    if (value.is_number()) scalars.emplace_back(name, value.get<double>());
    // A list of numbers (each expert's tokens): one scalar per entry, NAME/INDEX.
    if (value.is_array())
      for (size_t i = 0; i < value.size(); ++i)
        if (value[i].is_number()) scalars.emplace_back(fmt::format("{}/{}", name, i), value[i].get<double>());
  }
  write_record(encode_scalars_event(unix_seconds_now(), step->get<int64_t>(), scalars));
}

void TensorBoardWriter::write_record(const std::string& event) {
  out_ << tfrecord(event);
  out_.flush();
  if (!out_) throw ConfigError(fmt::format("tools.tensorboard: write to {} failed", path_.string()));
}

}  // namespace loom::train
