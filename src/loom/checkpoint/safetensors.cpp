#include "loom/checkpoint/safetensors.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "loom/checkpoint/durable_file.h"
#include "loom/util/errors.h"

namespace loom::checkpoint {

namespace fs = std::filesystem;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors stores little-endian bytes");

namespace {

// Larger headers are refused (as HuggingFace's reader does) so a corrupt length cannot make the
// parser read the whole file as JSON.
constexpr uint64_t kMaxHeaderBytes = 100u << 20;
constexpr const char* kMetadataKey = "__metadata__";

struct DtypeName {
  const char* name;
  at::ScalarType dtype;
};
constexpr DtypeName kDtypes[] = {
    {"F64", at::kDouble}, {"F32", at::kFloat}, {"F16", at::kHalf},  {"BF16", at::kBFloat16},
    {"I64", at::kLong},   {"I32", at::kInt},   {"I16", at::kShort}, {"I8", at::kChar},
    {"U8", at::kByte},    {"BOOL", at::kBool},
};

std::string known_dtype_list() {
  std::string list;
  for (const DtypeName& d : kDtypes) list += (list.empty() ? "" : " ") + std::string(d.name);
  return list;
}

bool parse_dtype(const std::string& name, at::ScalarType* dtype) {
  for (const DtypeName& d : kDtypes) {
    if (name == d.name) {
      *dtype = d.dtype;
      return true;
    }
  }
  return false;
}

// Reads a JSON value that must be a non-negative integer fitting in uint64.
bool as_unsigned(const nlohmann::json& value, uint64_t* out) {
  if (value.is_number_unsigned()) {
    *out = value.get<uint64_t>();
    return true;
  }
  if (value.is_number_integer() && value.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(value.get<int64_t>());
    return true;
  }
  return false;
}

}  // namespace

std::string safetensors_dtype_name(at::ScalarType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return d.name;
  }
  throw CheckpointError(fmt::format("dtype {} cannot be stored in safetensors; valid dtypes: {}",
                                    c10::toString(dtype), known_dtype_list()));
}

bool loadable_as(at::ScalarType stored, at::ScalarType target) {
  return at::isFloatingType(stored) == at::isFloatingType(target) &&
         at::isComplexType(stored) == at::isComplexType(target);
}

bool is_safetensors_dtype(at::ScalarType dtype) {
  for (const DtypeName& d : kDtypes) {
    if (d.dtype == dtype) return true;
  }
  return false;
}

// ---------------------------------------------------------------------------------------------
// Reader

struct SafetensorsReader::Mapping {
  const uint8_t* bytes = nullptr;
  size_t size = 0;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  Mapping() = default;
  ~Mapping() {
    if (bytes != nullptr) ::munmap(const_cast<uint8_t*>(bytes), size);
  }
};

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  auto fail = [&](const std::string& what) { return CheckpointError(fmt::format("'{}': {}", path_, what)); };

  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw fail(fmt::format("cannot open safetensors file: {}", std::strerror(errno)));
  struct stat info {};
  if (::fstat(fd, &info) != 0) {
    std::string reason = std::strerror(errno);
    ::close(fd);
    throw fail("cannot stat: " + reason);
  }
  auto mapping = std::make_shared<Mapping>();
  mapping->size = static_cast<size_t>(info.st_size);
  if (mapping->size < 8) {
    ::close(fd);
    throw fail(fmt::format("truncated safetensors file: {} bytes, shorter than the 8-byte header length",
                           mapping->size));
  }
  void* addr = ::mmap(nullptr, mapping->size, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);  // the mapping keeps the file open
  if (addr == MAP_FAILED) throw fail(fmt::format("cannot mmap: {}", std::strerror(errno)));
  mapping->bytes = static_cast<const uint8_t*>(addr);
  mapping_ = mapping;

  uint64_t header_len = 0;
  std::memcpy(&header_len, mapping->bytes, 8);
  const uint64_t available = mapping->size - 8;
  if (header_len > available) {
    throw fail(fmt::format("truncated safetensors file: header length {} exceeds the {} bytes after it",
                           header_len, available));
  }
  if (header_len > kMaxHeaderBytes) {
    throw fail(fmt::format("header length {} exceeds the limit of {} bytes", header_len, kMaxHeaderBytes));
  }
  const char* header_begin = reinterpret_cast<const char*>(mapping->bytes + 8);
  data_ = mapping->bytes + 8 + header_len;
  const size_t data_size = available - header_len;

  // Parse, noting repeated top-level keys (the JSON library would silently keep the last one).
  std::set<std::string> seen_keys;
  std::string duplicate;
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(
        header_begin, header_begin + header_len,
        [&](int depth, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
          if (depth == 1 && event == nlohmann::json::parse_event_t::key && duplicate.empty()) {
            std::string key = parsed.get<std::string>();
            if (!seen_keys.insert(key).second) duplicate = key;
          }
          return true;
        });
  } catch (const nlohmann::json::exception& e) {
    throw fail(fmt::format("header is not valid JSON: {}", e.what()));
  }
  if (!header.is_object()) throw fail("header is not a JSON object");
  if (!duplicate.empty()) throw fail(fmt::format("tensor '{}' appears twice in the header", duplicate));

  for (const auto& [name, value] : header.items()) {
    if (name == kMetadataKey) {
      if (!value.is_object()) throw fail("__metadata__ is not an object of strings");
      for (const auto& [key, text] : value.items()) {
        if (!text.is_string()) throw fail(fmt::format("__metadata__ value of '{}' is not a string", key));
        metadata_[key] = text.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) { return fail(fmt::format("tensor '{}': {}", name, what)); };
    if (!value.is_object()) throw bad("header entry is not an object");
    if (!value.contains("dtype") || !value["dtype"].is_string()) throw bad("missing string field 'dtype'");
    if (!value.contains("shape") || !value["shape"].is_array()) throw bad("missing array field 'shape'");
    if (!value.contains("data_offsets") || !value["data_offsets"].is_array() ||
        value["data_offsets"].size() != 2) {
      throw bad("missing field 'data_offsets' = [begin, end]");
    }
    Entry entry{};
    const std::string dtype_name = value["dtype"].get<std::string>();
    if (!parse_dtype(dtype_name, &entry.dtype)) {
      throw bad(fmt::format("unsupported dtype '{}'; valid dtypes: {}", dtype_name, known_dtype_list()));
    }
    // numel * itemsize, refusing overflow.
    uint64_t expected_bytes = c10::elementSize(entry.dtype);
    for (const nlohmann::json& dim : value["shape"]) {
      uint64_t size = 0;
      if (!as_unsigned(dim, &size) || size > uint64_t(std::numeric_limits<int64_t>::max())) {
        throw bad(
            fmt::format("shape {} has an entry that is not a non-negative integer", value["shape"].dump()));
      }
      entry.shape.push_back(static_cast<int64_t>(size));
      if (size != 0 && expected_bytes > std::numeric_limits<uint64_t>::max() / size) {
        throw bad(fmt::format("shape {} is too large", value["shape"].dump()));
      }
      expected_bytes *= size;
    }
    uint64_t begin = 0, end = 0;
    if (!as_unsigned(value["data_offsets"][0], &begin) || !as_unsigned(value["data_offsets"][1], &end)) {
      throw bad("data_offsets are not non-negative integers");
    }
    if (begin > end) throw bad(fmt::format("data_offsets [{}, {}] end before they begin", begin, end));
    if (end > data_size) {
      throw bad(fmt::format("data_offsets [{}, {}] lie outside the {} bytes of tensor data", begin, end,
                            data_size));
    }
    if (end - begin != expected_bytes) {
      throw bad(fmt::format("data_offsets [{}, {}] hold {} bytes but shape {} of {} needs {}", begin, end,
                            end - begin, value["shape"].dump(), dtype_name, expected_bytes));
    }
    entry.begin = static_cast<size_t>(begin);
    entry.end = static_cast<size_t>(end);
    entries_.emplace(name, std::move(entry));
    order_.push_back(name);
  }

  // The tensors must tile the data region exactly, in offset order.
  std::stable_sort(order_.begin(), order_.end(), [&](const std::string& a, const std::string& b) {
    const Entry& x = entries_.at(a);
    const Entry& y = entries_.at(b);
    return x.begin != y.begin ? x.begin < y.begin : x.end < y.end;
  });
  size_t position = 0;
  for (const std::string& name : order_) {
    const Entry& e = entries_.at(name);
    if (e.begin != position) {
      throw fail(
          fmt::format("tensor '{}': data starts at byte {} but the previous tensor ends at byte {} "
                      "(tensor data must follow each other without gaps or overlaps)",
                      name, e.begin, position));
    }
    position = e.end;
  }
  if (position != data_size) {
    throw fail(
        fmt::format("{} bytes of data follow the last tensor (data region is {} bytes, tensors cover {})",
                    data_size - position, data_size, position));
  }
}

const SafetensorsReader::Entry& SafetensorsReader::entry(const std::string& name) const {
  auto it = entries_.find(name);
  if (it == entries_.end()) {
    throw CheckpointError(
        fmt::format("'{}': no tensor named '{}' ({} tensors in the file)", path_, name, entries_.size()));
  }
  return it->second;
}

std::vector<std::string> SafetensorsReader::names() const { return order_; }

bool SafetensorsReader::contains(const std::string& name) const { return entries_.count(name) != 0; }

std::vector<int64_t> SafetensorsReader::shape(const std::string& name) const { return entry(name).shape; }

at::ScalarType SafetensorsReader::dtype(const std::string& name) const { return entry(name).dtype; }

size_t SafetensorsReader::nbytes(const std::string& name) const {
  const Entry& e = entry(name);
  return e.end - e.begin;
}

at::Tensor SafetensorsReader::load(const std::string& name) const {
  const Entry& e = entry(name);
  const uint8_t* source = data_ + e.begin;
  const size_t size = e.end - e.begin;
  if (e.dtype == at::kBool) {
    // Any byte other than 0 or 1 would be an invalid bool in the tensor.
    for (size_t i = 0; i < size; ++i) {
      if (source[i] > 1) {
        throw CheckpointError(
            fmt::format("'{}': tensor '{}' is BOOL but byte {} holds {}", path_, name, i, int(source[i])));
      }
    }
  }
  at::Tensor tensor = at::empty(e.shape, at::TensorOptions().dtype(e.dtype).device(at::kCPU));
  if (size > 0) std::memcpy(tensor.data_ptr(), source, size);
  return tensor;
}

at::Tensor SafetensorsReader::load_rows(const std::string& name, int64_t begin, int64_t end) const {
  const Entry& e = entry(name);
  if (e.shape.empty() || begin < 0 || end < begin || end > e.shape[0])
    throw CheckpointError(fmt::format("'{}': rows [{}, {}) of tensor '{}' of shape [{}] do not exist", path_,
                                      begin, end, name, fmt::join(e.shape, ", ")));
  if (e.dtype == at::kBool) return load(name).slice(0, begin, end).clone();
  std::vector<int64_t> shape = e.shape;
  shape[0] = end - begin;
  const size_t row = e.shape[0] == 0 ? 0 : (e.end - e.begin) / static_cast<size_t>(e.shape[0]);
  at::Tensor tensor = at::empty(shape, at::TensorOptions().dtype(e.dtype).device(at::kCPU));
  const size_t size = row * static_cast<size_t>(end - begin);
  if (size > 0) std::memcpy(tensor.data_ptr(), data_ + e.begin + row * static_cast<size_t>(begin), size);
  return tensor;
}

// ---------------------------------------------------------------------------------------------
// Writer

void save_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                      const std::map<std::string, std::string>& metadata) {
  std::vector<at::Tensor> contiguous;
  contiguous.reserve(tensors.size());
  std::set<std::string> names;
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [key, value] : metadata) meta[key] = value;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : tensors) {
    auto bad = [&](const std::string& what) {
      return CheckpointError(fmt::format("cannot save '{}': tensor '{}' {}", path, name, what));
    };
    if (name.empty() || name == kMetadataKey) throw bad("has a reserved or empty name");
    if (!names.insert(name).second) throw bad("is given twice");
    if (!tensor.defined()) throw bad("is undefined");
    if (!is_safetensors_dtype(tensor.scalar_type())) {
      throw bad(fmt::format("has dtype {}; valid dtypes: {}", c10::toString(tensor.scalar_type()),
                            known_dtype_list()));
    }
    at::Tensor cpu = tensor.detach().to(at::kCPU).contiguous();
    const uint64_t size = static_cast<uint64_t>(cpu.numel()) * cpu.element_size();
    nlohmann::ordered_json entry = nlohmann::ordered_json::object();
    entry["dtype"] = safetensors_dtype_name(cpu.scalar_type());
    entry["shape"] = cpu.sizes().vec();
    entry["data_offsets"] = {offset, offset + size};
    header[name] = std::move(entry);
    offset += size;
    contiguous.push_back(std::move(cpu));
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::json::exception& e) {
    throw CheckpointError(
        fmt::format("cannot save '{}': a name or metadata value is not UTF-8: {}", path, e.what()));
  }
  // Pad so the data starts 8-byte aligned (after the 8-byte length and the header).
  text.append((8 - text.size() % 8) % 8, ' ');
  const uint64_t header_len = text.size();

  DurableFileWriter out(path);
  out.write(&header_len, sizeof(header_len));
  out.write(text.data(), text.size());
  for (const at::Tensor& t : contiguous) {
    const size_t size = static_cast<size_t>(t.numel()) * t.element_size();
    if (size > 0) out.write(t.data_ptr(), size);
  }
  out.commit();
}

// ---------------------------------------------------------------------------------------------
// HuggingFace model directory

WeightSource::WeightSource(const std::string& directory) : directory_(directory) {
  const fs::path dir(directory);
  const fs::path index_path = dir / "model.safetensors.index.json";
  const fs::path single_path = dir / "model.safetensors";
  // A single file wins over an index when both exist, as in transformers.
  if (fs::is_regular_file(single_path)) {
    shards_.emplace_back(single_path.string());
    for (const std::string& name : shards_[0].names()) shard_of_[name] = 0;
  } else if (fs::is_regular_file(index_path)) {
    std::ifstream in(index_path);
    std::stringstream text;
    text << in.rdbuf();
    if (!in) throw CheckpointError(fmt::format("cannot read '{}'", index_path.string()));
    nlohmann::json index;
    try {
      index = nlohmann::json::parse(text.str());
    } catch (const nlohmann::json::exception& e) {
      throw CheckpointError(fmt::format("'{}' is not valid JSON: {}", index_path.string(), e.what()));
    }
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object()) {
      throw CheckpointError(
          fmt::format("'{}' has no object 'weight_map' (tensor name -> shard file)", index_path.string()));
    }
    std::map<std::string, size_t> shard_index;  // file name -> index into shards_
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string()) {
        throw CheckpointError(
            fmt::format("'{}': weight_map entry '{}' is not a file name", index_path.string(), name));
      }
      const std::string file_name = file.get<std::string>();
      auto found = shard_index.find(file_name);
      if (found == shard_index.end()) {
        const fs::path shard_path = dir / file_name;
        if (!fs::is_regular_file(shard_path)) {
          throw CheckpointError(fmt::format("'{}' puts tensor '{}' in shard '{}', which does not exist",
                                            index_path.string(), name, shard_path.string()));
        }
        shards_.emplace_back(shard_path.string());
        found = shard_index.emplace(file_name, shards_.size() - 1).first;
      }
      if (!shards_[found->second].contains(name)) {
        throw CheckpointError(fmt::format("'{}' puts tensor '{}' in shard '{}', which does not hold it",
                                          index_path.string(), name, shards_[found->second].path()));
      }
      shard_of_[name] = found->second;
    }
  } else {
    throw CheckpointError(
        fmt::format("'{}' holds neither model.safetensors.index.json nor model.safetensors", directory));
  }
}

const SafetensorsReader& WeightSource::reader_of(const std::string& name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end()) {
    throw CheckpointError(fmt::format("'{}': the model has no tensor named '{}'", directory_, name));
  }
  return shards_[it->second];
}

std::vector<std::string> WeightSource::names() const {
  std::vector<std::string> result;
  result.reserve(shard_of_.size());
  for (const auto& [name, shard] : shard_of_) result.push_back(name);
  return result;
}

bool WeightSource::contains(const std::string& name) const { return shard_of_.count(name) != 0; }

std::vector<int64_t> WeightSource::shape(const std::string& name) const {
  return reader_of(name).shape(name);
}

at::ScalarType WeightSource::dtype(const std::string& name) const { return reader_of(name).dtype(name); }

at::Tensor WeightSource::load(const std::string& name) const { return reader_of(name).load(name); }

const std::string& WeightSource::file_of(const std::string& name) const { return reader_of(name).path(); }

}  // namespace loom::checkpoint
