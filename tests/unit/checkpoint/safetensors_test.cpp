// SafetensorsReader against hand-made bytes and HuggingFace's own file; save_safetensors round
// trips and its on-disk layout; the reader's refusal of each kind of corruption.
#include "loom/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "loom/util/errors.h"
#include "temp_dir.h"

namespace loom::checkpoint {
namespace {

using testing::expect_checkpoint_error;

using testing::read_bytes;
using testing::TempDir;
using testing::write_bytes;

// Appends `value` as `sizeof(T)` little-endian bytes, written out one by one.
template <typename T>
void append_le(std::string& out, T value) {
  uint64_t bits = 0;
  std::memcpy(&bits, &value, sizeof(T));
  for (size_t i = 0; i < sizeof(T); ++i) out.push_back(static_cast<char>((bits >> (8 * i)) & 0xff));
}

// A whole safetensors file: 8-byte length, the header (space padded to a multiple of 8 if asked), data.
std::string safetensors_bytes(const std::string& header, const std::string& data, bool pad = true) {
  std::string text = header;
  if (pad) text.append((8 - text.size() % 8) % 8, ' ');
  std::string out;
  append_le<uint64_t>(out, text.size());
  return out + text + data;
}

int16_t bits16(const at::Tensor& t, int64_t i) { return t.view(at::kShort)[i].item<int16_t>(); }

TEST(SafetensorsReader, ReadsHandMadeFileOfEveryDtype) {
  // Offsets listed out of data order on purpose: names() must follow the data.
  const std::string header = R"({"__metadata__":{"format":"pt","note":"hand made"},)"
                             R"("b16":{"dtype":"BF16","shape":[3],"data_offsets":[16,22]},)"
                             R"("f32":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]},)"
                             R"("h16":{"dtype":"F16","shape":[3],"data_offsets":[22,28]},)"
                             R"("i64":{"dtype":"I64","shape":[2],"data_offsets":[28,44]},)"
                             R"("flag":{"dtype":"BOOL","shape":[1,3],"data_offsets":[44,47]},)"
                             R"("u8":{"dtype":"U8","shape":[],"data_offsets":[47,48]},)"
                             R"("i8":{"dtype":"I8","shape":[2],"data_offsets":[48,50]},)"
                             R"("i16":{"dtype":"I16","shape":[1],"data_offsets":[50,52]},)"
                             R"("i32":{"dtype":"I32","shape":[1],"data_offsets":[52,56]},)"
                             R"("f64":{"dtype":"F64","shape":[1],"data_offsets":[56,64]},)"
                             R"("empty":{"dtype":"F32","shape":[0,3],"data_offsets":[64,64]}})";
  std::string data;
  // F32 1.5, -2, 0.25, 3
  for (uint32_t bits : {0x3FC00000u, 0xC0000000u, 0x3E800000u, 0x40400000u}) append_le<uint32_t>(data, bits);
  // BF16 1.5, -2, +inf
  for (uint16_t bits : {0x3FC0, 0xC000, 0x7F80}) append_le<uint16_t>(data, bits);
  // F16 1.5, -2, 65504 (largest finite half)
  for (uint16_t bits : {0x3E00, 0xC000, 0x7BFF}) append_le<uint16_t>(data, bits);
  append_le<uint64_t>(data, 0xFFFFFFFFFFFFFFFDull);  // -3
  append_le<uint64_t>(data, 1ull << 40);
  data += std::string("\x01\x00\x01", 3);                      // BOOL true false true
  data += '\xC8';                                              // U8 200
  data += std::string("\x80\x7F", 2);                          // I8 -128 127
  data += std::string("\xFE\xFF", 2);                          // I16 -2
  data += std::string("\x78\x56\x34\x12", 4);                  // I32 0x12345678
  data += std::string("\x00\x00\x00\x00\x00\x00\xE0\xBF", 8);  // F64 -0.5
  ASSERT_EQ(data.size(), 64u);

  TempDir dir;
  const std::string path = dir.file("hand.safetensors");
  write_bytes(path, safetensors_bytes(header, data));
  SafetensorsReader reader(path);

  EXPECT_EQ(reader.names(), (std::vector<std::string>{"f32", "b16", "h16", "i64", "flag", "u8", "i8", "i16",
                                                      "i32", "f64", "empty"}));
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"note", "hand made"}}));
  EXPECT_TRUE(reader.contains("h16"));
  EXPECT_FALSE(reader.contains("__metadata__"));

  at::Tensor f32 = reader.load("f32");
  EXPECT_EQ(f32.scalar_type(), at::kFloat);
  EXPECT_EQ(f32.sizes().vec(), (std::vector<int64_t>{2, 2}));
  EXPECT_TRUE(f32.is_contiguous());
  EXPECT_EQ(f32[0][0].item<float>(), 1.5f);
  EXPECT_EQ(f32[0][1].item<float>(), -2.0f);
  EXPECT_EQ(f32[1][0].item<float>(), 0.25f);
  EXPECT_EQ(f32[1][1].item<float>(), 3.0f);

  at::Tensor b16 = reader.load("b16");
  EXPECT_EQ(reader.dtype("b16"), at::kBFloat16);
  EXPECT_EQ(b16.scalar_type(), at::kBFloat16);
  at::Tensor b16f = b16.to(at::kFloat);
  EXPECT_EQ(b16f[0].item<float>(), 1.5f);
  EXPECT_EQ(b16f[1].item<float>(), -2.0f);
  EXPECT_EQ(b16f[2].item<float>(), std::numeric_limits<float>::infinity());
  EXPECT_EQ(bits16(b16, 0), 0x3FC0);
  EXPECT_EQ(static_cast<uint16_t>(bits16(b16, 1)), 0xC000);

  at::Tensor h16 = reader.load("h16");
  EXPECT_EQ(h16.scalar_type(), at::kHalf);
  at::Tensor h16f = h16.to(at::kFloat);
  EXPECT_EQ(h16f[0].item<float>(), 1.5f);
  EXPECT_EQ(h16f[1].item<float>(), -2.0f);
  EXPECT_EQ(h16f[2].item<float>(), 65504.0f);
  EXPECT_EQ(bits16(h16, 2), 0x7BFF);

  at::Tensor i64 = reader.load("i64");
  EXPECT_EQ(i64.scalar_type(), at::kLong);
  EXPECT_EQ(i64[0].item<int64_t>(), -3);
  EXPECT_EQ(i64[1].item<int64_t>(), int64_t(1) << 40);

  at::Tensor flag = reader.load("flag");
  EXPECT_EQ(flag.scalar_type(), at::kBool);
  EXPECT_EQ(flag.sizes().vec(), (std::vector<int64_t>{1, 3}));
  EXPECT_TRUE(flag[0][0].item<bool>());
  EXPECT_FALSE(flag[0][1].item<bool>());
  EXPECT_TRUE(flag[0][2].item<bool>());

  at::Tensor u8 = reader.load("u8");
  EXPECT_EQ(u8.dim(), 0);
  EXPECT_EQ(u8.scalar_type(), at::kByte);
  EXPECT_EQ(u8.item<uint8_t>(), 200);

  at::Tensor i8 = reader.load("i8");
  EXPECT_EQ(i8.scalar_type(), at::kChar);
  EXPECT_EQ(i8[0].item<int8_t>(), -128);
  EXPECT_EQ(i8[1].item<int8_t>(), 127);
  EXPECT_EQ(reader.load("i16").item<int16_t>(), -2);
  EXPECT_EQ(reader.dtype("i16"), at::kShort);
  EXPECT_EQ(reader.load("i32").item<int32_t>(), 0x12345678);
  EXPECT_EQ(reader.dtype("i32"), at::kInt);
  EXPECT_EQ(reader.load("f64").item<double>(), -0.5);
  EXPECT_EQ(reader.dtype("f64"), at::kDouble);

  at::Tensor empty = reader.load("empty");
  EXPECT_EQ(empty.sizes().vec(), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(reader.shape("empty"), (std::vector<int64_t>{0, 3}));
  EXPECT_EQ(reader.nbytes("i64"), 16u);
}

TEST(SafetensorsReader, LoadedTensorOwnsItsMemory) {
  TempDir dir;
  const std::string path = dir.file("one.safetensors");
  std::string data;
  append_le<float>(data, 7.0f);
  write_bytes(path, safetensors_bytes(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", data));
  at::Tensor x;
  {
    SafetensorsReader reader(path);
    x = reader.load("x");
    // A second load is a separate copy.
    x.fill_(1.0f);
    EXPECT_EQ(reader.load("x").item<float>(), 7.0f);
  }
  std::filesystem::remove(path);
  EXPECT_EQ(x.item<float>(), 1.0f);
}

TEST(SafetensorsReader, LoadRowsCopiesJustTheRowsOfTheFirstDimension) {
  TempDir dir;
  const std::string path = dir.file("rows.safetensors");
  const at::Tensor x = at::arange(5 * 2 * 3, at::kFloat).reshape({5, 2, 3});
  const at::Tensor i = at::arange(7, at::kLong);
  save_safetensors(path, {{"x", x}, {"i", i}});
  const SafetensorsReader reader(path);
  EXPECT_TRUE(at::equal(reader.load_rows("x", 1, 4), x.slice(0, 1, 4)));
  EXPECT_TRUE(at::equal(reader.load_rows("x", 4, 5), x.slice(0, 4, 5)));
  EXPECT_EQ(reader.load_rows("x", 2, 2).sizes().vec(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_TRUE(at::equal(reader.load_rows("i", 3, 7), i.slice(0, 3, 7)));
  for (auto [begin, end] : {std::pair{-1, 2}, {3, 2}, {4, 6}}) {
    try {
      reader.load_rows("x", begin, end);
      ADD_FAILURE() << "rows " << begin << ".." << end << " were read";
    } catch (const CheckpointError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST(SafetensorsReader, AcceptsUnpaddedHeader) {
  TempDir dir;
  const std::string path = dir.file("unpadded.safetensors");
  std::string data;
  append_le<int32_t>(data, -5);
  const std::string header = R"({"a":{"dtype":"I32","shape":[1],"data_offsets":[0,4]}})";
  ASSERT_NE(header.size() % 8, 0u);
  write_bytes(path, safetensors_bytes(header, data, /*pad=*/false));
  EXPECT_EQ(SafetensorsReader(path).load("a").item<int32_t>(), -5);
}

// ---------------------------------------------------------------------------------------------
// Corruption: each is refused with a message naming the file (and the tensor where there is one).

struct Corruption {
  const char* what;
  std::string bytes;
  std::vector<std::string> message_parts;  // besides the path
};

std::vector<Corruption> corruptions() {
  std::string four;
  append_le<float>(four, 1.0f);
  const std::string sixteen(16, '\0');
  std::vector<Corruption> list;
  list.push_back({"shorter than the length field", std::string("\x10\x00\x00", 3), {"truncated"}});
  {
    std::string bytes;
    append_le<uint64_t>(bytes, 1000);
    bytes += R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})";
    list.push_back({"header length beyond file", bytes, {"header length 1000"}});
  }
  list.push_back({"bad JSON", safetensors_bytes(R"({"w":{"dtype":"F32", )", four), {"not valid JSON"}});
  list.push_back({"header not an object", safetensors_bytes("[1,2]", ""), {"not a JSON object"}});
  list.push_back({"unknown dtype",
                  safetensors_bytes(R"({"w":{"dtype":"F8_E4M3","shape":[4],"data_offsets":[0,4]}})", four),
                  {"'w'", "F8_E4M3", "BF16"}});
  list.push_back({"missing shape",
                  safetensors_bytes(R"({"w":{"dtype":"F32","data_offsets":[0,4]}})", four),
                  {"'w'", "shape"}});
  list.push_back({"negative shape",
                  safetensors_bytes(R"({"w":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", four),
                  {"'w'", "non-negative"}});
  list.push_back({"offsets outside data",
                  safetensors_bytes(R"({"w":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})", sixteen),
                  {"'w'", "outside the 16 bytes"}});
  list.push_back({"offsets reversed",
                  safetensors_bytes(R"({"w":{"dtype":"F32","shape":[0],"data_offsets":[8,4]}})", sixteen),
                  {"'w'", "[8, 4]"}});
  list.push_back({"offsets not matching shape",
                  safetensors_bytes(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", sixteen),
                  {"'w'", "needs 12"}});
  list.push_back({"overlapping tensors",
                  safetensors_bytes(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]},)"
                                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
                                    sixteen),
                  {"'b'", "byte 8", "ends at byte 12"}});
  list.push_back({"gap between tensors",
                  safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("b":{"dtype":"F32","shape":[1],"data_offsets":[12,16]}})",
                                    sixteen),
                  {"'b'", "byte 12"}});
  list.push_back({"trailing bytes",
                  safetensors_bytes(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", sixteen),
                  {"8 bytes of data follow the last tensor"}});
  list.push_back({"duplicate tensor",
                  safetensors_bytes(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                    R"("a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                                    four),
                  {"'a'", "twice"}});
  list.push_back(
      {"metadata not strings",
       safetensors_bytes(R"({"__metadata__":{"n":3},"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})",
                         four),
       {"__metadata__", "'n'"}});
  return list;
}

TEST(SafetensorsReader, RejectsEachCorruptionNamingTheFile) {
  TempDir dir;
  for (const Corruption& c : corruptions()) {
    SCOPED_TRACE(c.what);
    const std::string path = dir.file("corrupt.safetensors");
    write_bytes(path, c.bytes);
    std::vector<std::string> parts = c.message_parts;
    parts.push_back(path);
    expect_checkpoint_error([&] { SafetensorsReader reader(path); }, parts);
  }
}

TEST(SafetensorsReader, RejectsMissingFileUnknownNameAndInvalidBool) {
  TempDir dir;
  expect_checkpoint_error([&] { SafetensorsReader reader(dir.file("absent.safetensors")); },
                          {dir.file("absent.safetensors"), "cannot open"});

  const std::string path = dir.file("bool.safetensors");
  write_bytes(path, safetensors_bytes(R"({"mask":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
                                      std::string("\x01\x02", 2)));
  SafetensorsReader reader(path);
  expect_checkpoint_error([&] { reader.load("mask"); }, {path, "'mask'", "byte 1 holds 2"});
  expect_checkpoint_error([&] { reader.load("other"); }, {path, "'other'"});
  expect_checkpoint_error([&] { reader.shape("other"); }, {path, "'other'"});
}

// ---------------------------------------------------------------------------------------------
// Writer

std::vector<std::pair<std::string, at::Tensor>> tensors_of_every_dtype() {
  // Non-contiguous and offset views on purpose: the writer must store the logical values.
  at::Tensor base = at::arange(24, at::kDouble).reshape({4, 6}) * 0.37 - 3.0;
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  tensors.emplace_back("f64", base.t());
  tensors.emplace_back("f32", base.to(at::kFloat).slice(1, 1, 5));
  tensors.emplace_back("f16", base.to(at::kHalf)[2]);
  tensors.emplace_back("bf16", base.to(at::kBFloat16).t().contiguous());
  tensors.emplace_back("i64", (base * 1e6).to(at::kLong));
  tensors.emplace_back("i32", (base * 100).to(at::kInt).t());
  tensors.emplace_back("i16", (base * 10).to(at::kShort));
  tensors.emplace_back("i8", (base * 10).to(at::kChar).select(0, 1));
  tensors.emplace_back("u8", at::arange(256, at::kInt).to(at::kByte).reshape({16, 16}).t());
  tensors.emplace_back("bool", base.gt(0.0).t());
  tensors.emplace_back("scalar", at::scalar_tensor(2.5, at::kFloat));
  tensors.emplace_back("empty", at::empty({0, 5}, at::kFloat));
  return tensors;
}

TEST(SaveSafetensors, RoundTripsEveryDtype) {
  TempDir dir;
  const std::string path = dir.file("all.safetensors");
  const auto tensors = tensors_of_every_dtype();
  save_safetensors(path, tensors, {{"format", "pt"}, {"step", "12"}});
  SafetensorsReader reader(path);
  std::vector<std::string> expected_names;
  for (const auto& [name, tensor] : tensors) expected_names.push_back(name);
  EXPECT_EQ(reader.names(), expected_names);
  EXPECT_EQ(reader.metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"step", "12"}}));
  for (const auto& [name, tensor] : tensors) {
    SCOPED_TRACE(name);
    at::Tensor loaded = reader.load(name);
    EXPECT_EQ(loaded.scalar_type(), tensor.scalar_type());
    EXPECT_EQ(loaded.sizes(), tensor.sizes());
    EXPECT_EQ(reader.shape(name), tensor.sizes().vec());
    EXPECT_TRUE(loaded.equal(tensor));
  }
}

TEST(SaveSafetensors, WritesTheDocumentedLayout) {
  TempDir dir;
  const std::string path = dir.file("layout.safetensors");
  at::Tensor a = at::tensor({1.0f, -2.0f, 0.5f});
  at::Tensor b = at::tensor({int64_t(7), int64_t(-9)}, at::kLong);
  save_safetensors(path, {{"a", a}, {"b", b}});

  const std::string bytes = read_bytes(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(bytes[i]);
  EXPECT_EQ(header_len % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + header_len + 12 + 16);
  const std::string header_text = bytes.substr(8, header_len);
  EXPECT_EQ(header_text.substr(header_text.rfind('}') + 1).find_first_not_of(' '), std::string::npos)
      << "the header is padded with spaces only";
  const nlohmann::json header = nlohmann::json::parse(header_text);
  EXPECT_FALSE(header.contains("__metadata__"));
  EXPECT_EQ(header["a"]["dtype"], "F32");
  EXPECT_EQ(header["a"]["shape"], nlohmann::json::array({3}));
  EXPECT_EQ(header["a"]["data_offsets"], nlohmann::json::array({0, 12}));
  EXPECT_EQ(header["b"]["dtype"], "I64");
  EXPECT_EQ(header["b"]["data_offsets"], nlohmann::json::array({12, 28}));

  std::string expected_data;
  for (float v : {1.0f, -2.0f, 0.5f}) append_le<float>(expected_data, v);
  for (int64_t v : {int64_t(7), int64_t(-9)}) append_le<int64_t>(expected_data, v);
  EXPECT_EQ(bytes.substr(8 + header_len), expected_data);
}

TEST(SaveSafetensors, RefusesBadInputAndLeavesTheOldFileIntact) {
  TempDir dir;
  const std::string path = dir.file("model.safetensors");
  save_safetensors(path, {{"w", at::ones({2})}});
  const std::string before = read_bytes(path);

  expect_checkpoint_error(
      [&] {
        save_safetensors(path, {{"w", at::ones({3})}, {"w", at::zeros({1})}});
      },
      {path, "'w'", "twice"});
  expect_checkpoint_error(
      [&] {
        save_safetensors(path, {{"c", at::ones({2}, at::kComplexFloat)}});
      },
      {path, "'c'", "ComplexFloat"});
  expect_checkpoint_error(
      [&] {
        save_safetensors(path, {{"__metadata__", at::ones({2})}});
      },
      {path, "__metadata__"});
  EXPECT_EQ(read_bytes(path), before);
  // Nothing but the file itself remains in the directory (no temporary leftovers).
  EXPECT_EQ(
      std::distance(std::filesystem::directory_iterator(dir.path()), std::filesystem::directory_iterator()),
      1);

  save_safetensors(path, {{"v", at::full({3}, 4.0)}});
  SafetensorsReader reader(path);
  EXPECT_EQ(reader.names(), std::vector<std::string>{"v"});
  EXPECT_TRUE(reader.load("v").equal(at::full({3}, 4.0)));
}

// ---------------------------------------------------------------------------------------------
// HuggingFace's file

std::map<std::string, std::vector<int64_t>> listed_state_dict() {
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-tiny/state_dict_names.txt");
  std::map<std::string, std::vector<int64_t>> result;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    std::istringstream fields(line);
    std::string name, shape_text, dtype;
    std::getline(fields, name, '\t');
    std::getline(fields, shape_text, '\t');
    std::getline(fields, dtype, '\t');
    EXPECT_EQ(dtype, "float32") << name;
    std::vector<int64_t> shape;
    for (char& c : shape_text) {
      if (c == '[' || c == ']' || c == ',') c = ' ';
    }
    std::istringstream dims(shape_text);
    for (int64_t d; dims >> d;) shape.push_back(d);
    result[name] = shape;
  }
  return result;
}

TEST(SafetensorsReader, ReadsHuggingFaceFixture) {
  const std::string path =
      std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/hf-qwen2-vl-tiny/model.safetensors";
  SafetensorsReader reader(path);
  const auto listed = listed_state_dict();
  ASSERT_EQ(listed.size(), 58u);
  const std::vector<std::string> ordered = reader.names();
  const std::set<std::string> names(ordered.begin(), ordered.end());
  EXPECT_EQ(ordered.size(), listed.size());
  for (const auto& [name, shape] : listed) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(names.count(name));
    EXPECT_EQ(reader.shape(name), shape);
    EXPECT_EQ(reader.dtype(name), at::kFloat);
  }
  EXPECT_EQ(reader.metadata().at("format"), "pt");

  // Values against numpy's reading of the same bytes (tests/fixtures/checkpoint/make.py).
  std::ifstream in(std::string(LOOM_SOURCE_DIR) + "/tests/fixtures/checkpoint/qwen2_vl_tiny_values.txt");
  std::string line;
  int checked = 0;
  while (std::getline(in, line)) {
    std::istringstream fields(line);
    std::string name;
    int64_t numel = 0;
    double sum = 0, first = 0, last = 0;
    fields >> name >> numel >> sum >> first >> last;
    SCOPED_TRACE(name);
    at::Tensor t = reader.load(name);
    EXPECT_EQ(t.numel(), numel);
    at::Tensor flat = t.reshape({-1});
    EXPECT_EQ(flat[0].item<float>(), static_cast<float>(first));
    EXPECT_EQ(flat[-1].item<float>(), static_cast<float>(last));
    EXPECT_NEAR(t.to(at::kDouble).sum().item<double>(), sum, 1e-9 * (1.0 + std::abs(sum)));
    ++checked;
  }
  EXPECT_EQ(checked, 58);
}

}  // namespace
}  // namespace loom::checkpoint
