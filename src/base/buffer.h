// buffer.h: typed, owning, move-only arrays on a device (Buffer) and in page-locked host memory (PinnedBuffer).
// No tensor framework: a buffer is a pointer, an element count and the device it lives on; shapes are
// written in comments where buffers are declared.
//
// Freeing (destructor, move assignment) frees at once: the owner makes sure no stream still uses the memory
// (synchronize it first), as it would have to with a stream-ordered allocator; resize takes that stream.
// upload, download and fill_bytes are host conveniences on the device's own stream (dev.stream); kernels and
// tables use the stream forms of src/base/device.h with the stream of their operation.
#pragma once

#include <cstddef>
#include <utility>
#include <vector>

#include "src/base/check.h"
#include "src/base/device.h"

namespace sparta {

template <class T>
class Buffer {
 public:
  Buffer() = default;
  // n elements on dev, uninitialized.
  Buffer(const Device& dev, size_t n) : dev_(dev), n_(n) { p_ = static_cast<T*>(device_alloc(dev_, n * sizeof(T))); }
  Buffer(const Device& dev, const std::vector<T>& host) : Buffer(dev, host.size()) { upload(host); }
  ~Buffer() { release(); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  Buffer(Buffer&& o) noexcept : dev_(o.dev_), p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      release();
      dev_ = o.dev_, p_ = o.p_, n_ = o.n_;
      o.p_ = nullptr, o.n_ = 0;
    }
    return *this;
  }

  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  bool empty() const { return n_ == 0; }
  const Device& device() const { return dev_; }

  // Reallocates to n elements when the size differs; contents are not kept. last_used is the stream that last
  // used the old memory: it is synchronized before the memory is freed (device_free_after), so a resize of a
  // buffer in flight is safe without relying on cudaFree's implicit synchronization.
  void resize(size_t n, Stream last_used) {
    if (n == n_) return;
    device_free_after(dev_, p_, last_used);
    p_ = nullptr;
    n_ = n;
    p_ = static_cast<T*>(device_alloc(dev_, n * sizeof(T)));
  }
  // Copies count host elements into [offset, offset+count). Asynchronous on the device's stream:
  // the host memory must stay alive until the stream reaches the copy (pageable memory is staged at once).
  void upload(const T* host, size_t count, size_t offset = 0) {
    SPARTA_ASSERT(offset + count <= n_, "upload of %zu elements at %zu into a buffer of %zu", count, offset, n_);
    copy_to_device(dev_, p_ + offset, host, count * sizeof(T));
  }
  void upload(const std::vector<T>& host) { upload(host.data(), host.size()); }
  // Copies the whole buffer to the host; synchronizes the device's stream.
  std::vector<T> download() const {
    std::vector<T> host(n_);
    copy_to_host(dev_, host.data(), p_, bytes());
    return host;
  }
  // Sets every byte; 0xFF poisons float outputs with NaN and integers with -1 in tests.
  void fill_bytes(int byte) { memset_device(dev_, p_, byte, bytes()); }

 private:
  void release() {
    device_free(dev_, p_);
    p_ = nullptr;
    n_ = 0;
  }
  Device dev_;
  T* p_ = nullptr;
  size_t n_ = 0;
};

// Host memory for staging and prefetching: page-locked for the cuda backend, plain host memory for cpu.
template <class T>
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  PinnedBuffer(Backend backend, size_t n) : backend_(backend), n_(n) {
    p_ = static_cast<T*>(pinned_alloc(backend, n * sizeof(T)));
  }
  ~PinnedBuffer() { pinned_free(backend_, p_); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;
  PinnedBuffer(PinnedBuffer&& o) noexcept : backend_(o.backend_), p_(o.p_), n_(o.n_) { o.p_ = nullptr, o.n_ = 0; }
  PinnedBuffer& operator=(PinnedBuffer&& o) noexcept {
    std::swap(backend_, o.backend_);
    std::swap(p_, o.p_);
    std::swap(n_, o.n_);
    return *this;
  }
  T* data() { return p_; }
  const T* data() const { return p_; }
  size_t size() const { return n_; }
  size_t bytes() const { return n_ * sizeof(T); }
  T& operator[](size_t i) { return p_[i]; }
  const T& operator[](size_t i) const { return p_[i]; }

 private:
  Backend backend_ = Backend::cpu;
  T* p_ = nullptr;
  size_t n_ = 0;
};

}  // namespace sparta
