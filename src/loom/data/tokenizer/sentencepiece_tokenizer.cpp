// SentencePiece models through the system's libsentencepiece, loaded with dlopen.
//
// Debian's libsentencepiece carries its own copy of protobuf 3.14 and exports it; linked into a
// process that also loads libtorch's libprotobuf 3.21, one copy's symbols replace the other's and
// the process crashes at start-up. So Loom never links it: the library is opened on first use with
// RTLD_LOCAL | RTLD_DEEPBIND, which keeps its protobuf to itself. Its classes are then used through
// their virtual functions (which need no symbols) and the four non-virtual functions looked up by name.
#include "loom/data/tokenizer/sentencepiece_tokenizer.h"

#include <dlfcn.h>
#include <sentencepiece_processor.h>

#include <new>

#include "loom/util/errors.h"

namespace loom::data {
namespace {

using sentencepiece::SentencePieceProcessor;
using sentencepiece::util::Status;

struct Library {
  void (*construct)(SentencePieceProcessor*) = nullptr;
  void (*destroy_status)(Status*) = nullptr;
  std::string (*status_text)(const Status*) = nullptr;
  std::string error;  // why the library could not be opened, if it could not

  Library() {
    void* handle = dlopen("libsentencepiece.so.0", RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
    if (!handle) {
      error = dlerror();
      return;
    }
    auto find = [&](const char* name) {
      void* symbol = dlsym(handle, name);
      if (!symbol && error.empty()) error = fmt::format("libsentencepiece.so.0 has no symbol {}", name);
      return symbol;
    };
    construct = reinterpret_cast<decltype(construct)>(find("_ZN13sentencepiece22SentencePieceProcessorC1Ev"));
    destroy_status = reinterpret_cast<decltype(destroy_status)>(find("_ZN13sentencepiece4util6StatusD1Ev"));
    status_text =
        reinterpret_cast<decltype(status_text)>(find("_ZNK13sentencepiece4util6Status8ToStringB5cxx11Ev"));
  }
};

const Library& library() {
  static const Library lib;
  if (!lib.error.empty()) throw DataError(fmt::format("cannot use libsentencepiece: {}", lib.error));
  return lib;
}

// Takes the Status a call returns without the compiler destroying it (its destructor lives in the
// library), and gives its message, or "" when it is OK.
template <typename Call>
std::string status_of(const Call& call) {
  alignas(Status) unsigned char storage[sizeof(Status)];
  Status* status = new (storage) Status(call());
  std::string message = status->ok() ? "" : library().status_text(status);
  library().destroy_status(status);
  return message;
}

}  // namespace

// Owns a SentencePieceProcessor built by the library's constructor; destroyed through its vtable.
struct SentencePieceTokenizer::Processor {
  SentencePieceProcessor* get = nullptr;
  Processor() {
    void* memory = ::operator new(sizeof(SentencePieceProcessor));
    library().construct(static_cast<SentencePieceProcessor*>(memory));
    get = static_cast<SentencePieceProcessor*>(memory);
  }
  ~Processor() {
    get->~SentencePieceProcessor();
    ::operator delete(get);
  }
};

SentencePieceTokenizer::SentencePieceTokenizer(std::unique_ptr<Processor> processor, std::string path)
    : processor_(std::move(processor)), path_(std::move(path)) {}
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer::~SentencePieceTokenizer() = default;

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& model_path) {
  auto processor = std::make_unique<Processor>();
  const std::string error = status_of([&] { return processor->get->Load(model_path); });
  if (!error.empty())
    throw DataError(fmt::format("cannot load SentencePiece model {}: {}", model_path, error));
  return SentencePieceTokenizer(std::move(processor), model_path);
}

std::vector<int64_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const std::string error = status_of([&] { return processor_->get->Encode(text, &ids); });
  if (!error.empty()) {
    throw DataError(fmt::format("SentencePiece model {} cannot encode the text: {}", path_, error));
  }
  return std::vector<int64_t>(ids.begin(), ids.end());
}

std::string SentencePieceTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::vector<int> narrow;
  narrow.reserve(ids.size());
  for (int64_t id : ids) {
    if (id < 0 || id >= vocab_size()) {
      throw DataError(fmt::format("token id {} is not in SentencePiece model {} (ids 0..{})", id, path_,
                                  vocab_size() - 1));
    }
    narrow.push_back(static_cast<int>(id));
  }
  std::string text;
  const std::string error = status_of([&] { return processor_->get->Decode(narrow, &text); });
  if (!error.empty()) {
    throw DataError(fmt::format("SentencePiece model {} cannot decode the ids: {}", path_, error));
  }
  return text;
}

int64_t SentencePieceTokenizer::id(const std::string& piece) const {
  const int id = processor_->get->PieceToId(piece);  // the unknown piece's id for anything not in the model
  if (processor_->get->IdToPiece(id) != piece) {
    throw DataError(fmt::format("piece '{}' is not in SentencePiece model {}", piece, path_));
  }
  return id;
}

int64_t SentencePieceTokenizer::vocab_size() const { return processor_->get->GetPieceSize(); }

}  // namespace loom::data
