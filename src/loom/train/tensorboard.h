// TensorBoard event files written without TensorFlow: metrics as scalar summaries, each Event
// protobuf encoded by hand and framed as a TFRecord (length, masked CRC32C, data, masked CRC32C).
// The field numbers are those of tensorboard/compat/proto/event.proto and summary.proto.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

namespace loom::train {

// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78) of `size` bytes: crc32c("123456789") = 0xE3069283.
uint32_t crc32c(const void* data, size_t size);
// The CRC as TFRecord stores it: rotated right by 15 bits plus 0xa282ead8.
uint32_t masked_crc32c(const void* data, size_t size);

// `data` framed as one TFRecord: uint64 length (little endian), masked CRC32C of those 8 bytes,
// the data, masked CRC32C of the data.
std::string tfrecord(const std::string& data);
// An Event{wall_time, step, file_version} (the first record of every event file).
std::string encode_file_version_event(double wall_time, const std::string& file_version);
// An Event{wall_time, step, summary{value: [{tag, simple_value}...]}}; values become 32-bit floats.
std::string encode_scalars_event(double wall_time, int64_t step,
                                 const std::vector<std::pair<std::string, double>>& scalars);

class TensorBoardWriter {
 public:
  // Creates `dir` and a new event file in it, events.out.tfevents.<unix seconds>.<host>.<pid>.loom
  // (.<n>.loom when that exists), starting with the file-version event "brain.Event:2". Throws
  // ConfigError when it cannot.
  explicit TensorBoardWriter(const std::filesystem::path& dir);

  // Writes the record's numbers (not booleans) other than "step" as scalars at its "step", in one
  // Event stamped with the current time, and flushes. A record without a numeric "step" is not
  // written (it has no place on TensorBoard's axis).
  void write(const nlohmann::json& record);

  const std::filesystem::path& path() const { return path_; }

 private:
  void write_record(const std::string& event);

  std::filesystem::path path_;
  std::ofstream out_;
};

}  // namespace loom::train
