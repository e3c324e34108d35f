#include "loom/memory/offload.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "loom/memory/counting_allocator.h"
#include "loom/util/errors.h"
#include "loom/util/tensor_storage.h"

namespace loom::memory {

// An unlinked file the offloaded tensors are appended to. Its space is given back whenever every
// tensor in it has been read back (after each backward pass).
class SpillFile {
 public:
  SpillFile() {
    const char* tmp = std::getenv("TMPDIR");
    const std::string directory = tmp && *tmp ? tmp : "/tmp";
#ifdef O_TMPFILE
    fd_ = ::open(directory.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
#endif
    if (fd_ < 0) {  // no O_TMPFILE here: a named file, unlinked at once
      std::string name = directory + "/loom-offload-XXXXXX";
      fd_ = ::mkostemp(name.data(), O_CLOEXEC);
      if (fd_ >= 0) ::unlink(name.c_str());
    }
    if (fd_ < 0)
      throw ModelError(fmt::format("features.offload: cannot create a spill file in {}: {}", directory,
                                   std::strerror(errno)));
    path_ = directory;
  }
  ~SpillFile() { ::close(fd_); }
  SpillFile(const SpillFile&) = delete;
  SpillFile& operator=(const SpillFile&) = delete;

  int64_t write(const void* data, int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    const int64_t offset = end_;
    const char* p = static_cast<const char*>(data);
    for (int64_t done = 0; done < n;) {
      const ssize_t w = ::pwrite(fd_, p + done, static_cast<size_t>(n - done), offset + done);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0)
        throw ModelError(fmt::format("features.offload: writing {} bytes to the spill file in {} failed: {}",
                                     n, path_, w < 0 ? std::strerror(errno) : "no space written"));
      done += w;
    }
    end_ += n;
    ++live_;
    moved_ += n;
    return offset;
  }

  void read(int64_t offset, void* data, int64_t n) const {
    char* p = static_cast<char*>(data);
    for (int64_t done = 0; done < n;) {
      const ssize_t r = ::pread(fd_, p + done, static_cast<size_t>(n - done), offset + done);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0)
        throw ModelError(
            fmt::format("features.offload: reading {} bytes back from the spill file in {} failed: {}", n,
                        path_, r < 0 ? std::strerror(errno) : "end of file"));
      done += r;
    }
  }

  // One tensor in the file is no longer needed; with none left, the file is emptied.
  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    if (--live_ == 0) {
      end_ = 0;
      if (::ftruncate(fd_, 0) != 0) {
        // The space stays taken until the next truncate; the data is not needed either way.
      }
    }
  }

  void count_prefetched(int64_t n) {
    std::lock_guard<std::mutex> lock(mutex_);
    prefetched_ += n;
  }
  int64_t moved() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return moved_;
  }
  int64_t prefetched() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return prefetched_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
  mutable std::mutex mutex_;
  int64_t end_ = 0, live_ = 0, moved_ = 0, prefetched_ = 0;
};

OffloadedTensor::OffloadedTensor(std::shared_ptr<SpillFile> file, const at::Tensor& tensor)
    : file_(std::move(file)),
      nbytes_(static_cast<int64_t>(tensor.nbytes())),
      sizes_(tensor.sizes().vec()),
      dtype_(tensor.scalar_type()) {
  offset_ = file_->write(tensor.data_ptr(), nbytes_);
}

OffloadedTensor::~OffloadedTensor() {
  if (pending_.valid()) pending_.wait();
  file_->release();
}

at::Tensor OffloadedTensor::read() const {
  at::Tensor out = at::empty(sizes_, at::TensorOptions().dtype(dtype_));
  file_->read(offset_, out.data_ptr(), nbytes_);
  return out;
}

void OffloadedTensor::prefetch() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (taken_ || pending_.valid()) return;
  // The read-back tensor is the training thread's memory: counted as its allocations are.
  const bool counted = CountingAllocator::counts_this_thread();
  pending_ = std::async(std::launch::async, [this, counted] {
    std::optional<CountingAllocator::Scope> scope;
    if (counted) scope.emplace();
    at::Tensor out = read();
    file_->count_prefetched(nbytes_);
    return out;
  });
}

at::Tensor OffloadedTensor::take() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (taken_) throw ModelError("features.offload: an offloaded tensor was read back twice");
  taken_ = true;
  return pending_.valid() ? pending_.get() : read();
}

Offloader::Offloader() : file_(std::make_shared<SpillFile>()) {}

bool Offloader::movable(const at::Tensor& tensor) {
  return tensor.defined() && tensor.device().is_cpu() && tensor.layout() == at::kStrided &&
         tensor.nbytes() > 0 && owns_storage(tensor);
}

std::shared_ptr<OffloadGroup> Offloader::move_out(const std::vector<at::Tensor>& tensors) {
  auto group = std::make_shared<OffloadGroup>();
  for (const auto& t : tensors) group->tensors.push_back(std::make_shared<OffloadedTensor>(file_, t));
  group->previous = last_;
  last_ = group;
  return group;
}

int64_t Offloader::bytes_moved() const { return file_->moved(); }
int64_t Offloader::bytes_prefetched() const { return file_->prefetched(); }
const std::string& Offloader::path() const { return file_->path(); }

}  // namespace loom::memory
