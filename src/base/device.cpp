// device.cpp: see device.h. The cuda paths compile only in CUDA builds; a CPU-only build reports no GPUs.
#include "src/base/device.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "src/base/check.h"

#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#endif

namespace sparta {

std::string Device::name() const {
  return backend == Backend::cuda ? "cuda:" + std::to_string(gpu) : std::string("cpu");
}

bool built_with_cuda() { return SPARTA_CUDA != 0; }

int visible_gpu_count() {
#if SPARTA_CUDA
  int n = 0;
  // No driver or no device is an answer (zero GPUs), not an error.
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();
    return 0;
  }
  return n;
#else
  return 0;
#endif
}

std::string gpu_name(int gpu) {
#if SPARTA_CUDA
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, gpu) == cudaSuccess) return prop.name;
  cudaGetLastError();
#else
  (void)gpu;
#endif
  return "";
}

Device open_device(Backend backend, int gpu) {
  Device dev;
  dev.backend = backend;
  if (backend == Backend::cpu) return dev;
#if SPARTA_CUDA
  int n = visible_gpu_count();
  if (gpu < 0 || gpu >= n) SPARTA_FATAL("GPU %d asked for, but this process sees %d GPU(s)", gpu, n);
  dev.gpu = gpu;
  CUDA_CHECK(cudaSetDevice(gpu));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  dev.stream = s;
#else
  SPARTA_FATAL("the cuda backend was asked for (GPU %d), but this binary was built with CUDA=0", gpu);
#endif
  return dev;
}

void close_device(Device& dev) {
#if SPARTA_CUDA
  if (dev.is_cuda() && dev.stream) {
    CUDA_CHECK(cudaStreamSynchronize(dev.stream));
    CUDA_CHECK(cudaStreamDestroy(dev.stream));
  }
#endif
  dev.stream = nullptr;
}

Stream create_stream(const Device& dev) {
  if (!dev.is_cuda()) return nullptr;
#if SPARTA_CUDA
  CUDA_CHECK(cudaSetDevice(dev.gpu));
  cudaStream_t s;
  CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  return s;
#else
  SPARTA_FATAL("a stream of %s in a CUDA=0 build", dev.name().c_str());
#endif
}

void destroy_stream(const Device& dev, Stream stream) {
  if (!dev.is_cuda() || !stream) return;
#if SPARTA_CUDA
  CUDA_CHECK(cudaStreamSynchronize(stream));
  CUDA_CHECK(cudaStreamDestroy(stream));
#endif
}

SideStream::SideStream(const Device& dev) : dev_(dev) {
  if (!dev.is_cuda()) return;
  stream_ = create_stream(dev);
  event_ = StreamEvent(dev);
}

SideStream::~SideStream() { release(); }

SideStream::SideStream(SideStream&& o) noexcept : dev_(o.dev_), stream_(o.stream_), event_(std::move(o.event_)) {
  o.stream_ = nullptr;
}

SideStream& SideStream::operator=(SideStream&& o) noexcept {
  if (this != &o) {
    release();
    dev_ = o.dev_;
    stream_ = o.stream_;
    event_ = std::move(o.event_);
    o.stream_ = nullptr;
  }
  return *this;
}

void SideStream::release() {
  if (stream_) destroy_stream(dev_, stream_);
  stream_ = nullptr;
  event_ = StreamEvent();
}

void SideStream::wait_for(Stream other) {
  if (!stream_ || other == stream_) return;
  event_.record(other);
  event_.wait_in(stream_);
}

void SideStream::join_into(Stream other) {
  if (!stream_ || other == stream_) return;
  event_.record(stream_);
  event_.wait_in(other);
}

StreamEvent::StreamEvent(const Device& dev) {
  if (!dev.is_cuda()) return;
#if SPARTA_CUDA
  cudaEvent_t e;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  event_ = e;
#endif
}

StreamEvent::~StreamEvent() {
#if SPARTA_CUDA
  if (event_) cudaEventDestroy(static_cast<cudaEvent_t>(event_));
#endif
}

StreamEvent::StreamEvent(StreamEvent&& o) noexcept : event_(o.event_), recorded_(o.recorded_) {
  o.event_ = nullptr;
  o.recorded_ = false;
}

StreamEvent& StreamEvent::operator=(StreamEvent&& o) noexcept {
  if (this != &o) {
    std::swap(event_, o.event_);
    std::swap(recorded_, o.recorded_);
  }
  return *this;
}

void StreamEvent::record(Stream s) {
  if (!event_) return;
#if SPARTA_CUDA
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event_), s));
  recorded_ = true;
#else
  (void)s;
#endif
}

void StreamEvent::wait_in(Stream t) {
  if (!event_ || !recorded_) return;
#if SPARTA_CUDA
  CUDA_CHECK(cudaStreamWaitEvent(t, static_cast<cudaEvent_t>(event_), 0));
#else
  (void)t;
#endif
}

StreamClock::StreamClock(const Device& dev) : dev_(dev) {}

StreamClock::~StreamClock() {
#if SPARTA_CUDA
  for (void* e : events_) cudaEventDestroy(static_cast<cudaEvent_t>(e));
#endif
}

void StreamClock::mark(Stream s, const std::string& label) {
  const size_t i = labels_.size();
  labels_.push_back(label);
  if (!dev_.is_cuda()) {
    host_ms_.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now().time_since_epoch())
                           .count());
    return;
  }
#if SPARTA_CUDA
  if (i == events_.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreate(&e));
    events_.push_back(e);
  }
  CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(events_[i]), s));
#else
  (void)s;
#endif
}

std::vector<StreamClock::Point> StreamClock::read() {
  std::vector<Point> points(labels_.size());
  for (size_t i = 0; i < points.size(); ++i) {
    points[i].label = labels_[i];
    if (!dev_.is_cuda()) {
      points[i].ms = host_ms_[i] - host_ms_[0];
      continue;
    }
#if SPARTA_CUDA
    float ms = 0;
    CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(events_[i])));
    CUDA_CHECK(cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(events_[0]), static_cast<cudaEvent_t>(events_[i])));
    points[i].ms = ms;
#endif
  }
  labels_.clear();
  host_ms_.clear();
  return points;
}

namespace {

// device_alloc's accounting: every live allocation's size, and the bytes in use per device (cpu is key -1).
struct Accounting {
  std::mutex m;
  std::unordered_map<void*, size_t> sizes;
  std::map<int, DeviceMemoryUse> use;
};
Accounting& accounting() {
  static Accounting* a = new Accounting;  // never destroyed: frees may come from static destructors
  return *a;
}
int device_key(const Device& dev) { return dev.is_cuda() ? dev.gpu : -1; }
void count_alloc(const Device& dev, void* p, size_t bytes) {
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.m);
  a.sizes[p] = bytes;
  DeviceMemoryUse& u = a.use[device_key(dev)];
  u.in_use += bytes;
  if (u.in_use > u.peak) u.peak = u.in_use;
}
void count_free(const Device& dev, void* p) {
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.m);
  auto it = a.sizes.find(p);
  if (it == a.sizes.end()) return;
  a.use[device_key(dev)].in_use -= it->second;
  a.sizes.erase(it);
}

void* host_alloc(size_t bytes) {
  size_t rounded = (bytes + 255) / 256 * 256;
  void* p = std::aligned_alloc(256, rounded);
  if (!p) SPARTA_FATAL("host allocation of %zu bytes failed", bytes);
  return p;
}
}  // namespace

static void* device_alloc_raw(const Device& dev, size_t bytes);  // cudaMalloc or host memory, uncounted

DeviceMemoryUse device_memory_use(const Device& dev) {
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.m);
  return a.use[device_key(dev)];
}

void reset_device_peak(const Device& dev) {
  Accounting& a = accounting();
  std::lock_guard<std::mutex> lock(a.m);
  DeviceMemoryUse& u = a.use[device_key(dev)];
  u.peak = u.in_use;
}

size_t device_free_bytes(const Device& dev) {
  if (!dev.is_cuda()) {
    std::ifstream in("/proc/meminfo");
    std::string name;
    size_t kib = 0;
    while (in >> name >> kib) {
      if (name == "MemAvailable:") return kib * 1024;
      in.ignore(256, '\n');
    }
    return 0;
  }
#if SPARTA_CUDA
  size_t free_b = 0, total_b = 0;
  CUDA_CHECK(cudaMemGetInfo(&free_b, &total_b));
  return free_b;
#else
  SPARTA_FATAL("cuda device in a CUDA=0 build");
#endif
}

void* device_alloc(const Device& dev, size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = device_alloc_raw(dev, bytes);
  count_alloc(dev, p, bytes);
  return p;
}

static void* device_alloc_raw(const Device& dev, size_t bytes) {
  if (!dev.is_cuda()) return host_alloc(bytes);
#if SPARTA_CUDA
  void* p = nullptr;
  cudaError_t err = cudaMalloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    size_t free_b = 0, total_b = 0;
    cudaMemGetInfo(&free_b, &total_b);
    SPARTA_FATAL("cudaMalloc of %zu bytes on GPU %d failed (%s); %zu of %zu bytes free", bytes, dev.gpu,
                 cudaGetErrorString(err), free_b, total_b);
  }
  return p;
#else
  SPARTA_FATAL("cuda allocation in a CUDA=0 build");
#endif
}

void device_free(const Device& dev, void* p) {
  if (!p) return;
  count_free(dev, p);
  if (!dev.is_cuda()) {
    std::free(p);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaFree(p));
#endif
}

void device_free_after(const Device& dev, void* p, Stream last_used) {
  if (!p) return;
  synchronize(dev, last_used);  // explicit: cudaFree's implicit synchronization is not relied upon
  device_free(dev, p);
}

void* pinned_alloc(Backend backend, size_t bytes) {
  if (bytes == 0) return nullptr;
#if SPARTA_CUDA
  if (backend == Backend::cuda) {
    void* p = nullptr;
    CUDA_CHECK(cudaMallocHost(&p, bytes));
    return p;
  }
#else
  (void)backend;
#endif
  return host_alloc(bytes);
}

void pinned_free(Backend backend, void* p) {
  if (!p) return;
#if SPARTA_CUDA
  if (backend == Backend::cuda) {
    CUDA_CHECK(cudaFreeHost(p));
    return;
  }
#else
  (void)backend;
#endif
  std::free(p);
}

void copy_to_device(const Device& dev, void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (!dev.is_cuda()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream));
#else
  (void)stream;
#endif
}

void copy_to_host(const Device& dev, void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (!dev.is_cuda()) {
    std::memcpy(dst, src, bytes);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream));
  CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  (void)stream;
#endif
}

void copy_on_device(const Device& dev, void* dst, const void* src, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (!dev.is_cuda()) {
    std::memmove(dst, src, bytes);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream));
#else
  (void)stream;
#endif
}

void memset_device(const Device& dev, void* dst, int byte, size_t bytes, Stream stream) {
  if (bytes == 0) return;
  if (!dev.is_cuda()) {
    std::memset(dst, byte, bytes);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemsetAsync(dst, byte, bytes, stream));
#else
  (void)stream;
#endif
}

void synchronize(const Device& dev, Stream stream) {
#if SPARTA_CUDA
  if (dev.is_cuda()) CUDA_CHECK(cudaStreamSynchronize(stream));
#else
  (void)dev, (void)stream;
#endif
}

void copy_to_device(const Device& dev, void* dst, const void* src, size_t bytes) {
  copy_to_device(dev, dst, src, bytes, dev.stream);
}
void copy_to_host(const Device& dev, void* dst, const void* src, size_t bytes) {
  copy_to_host(dev, dst, src, bytes, dev.stream);
}
void copy_on_device(const Device& dev, void* dst, const void* src, size_t bytes) {
  copy_on_device(dev, dst, src, bytes, dev.stream);
}
void memset_device(const Device& dev, void* dst, int byte, size_t bytes) {
  memset_device(dev, dst, byte, bytes, dev.stream);
}
void synchronize(const Device& dev) { synchronize(dev, dev.stream); }

}  // namespace sparta
