// device.h: the device a rank drives (the CPU or one GPU), its stream, and raw memory on it.
//
// Every rank drives exactly one device. The cpu backend is a complete implementation of every kernel;
// the cuda backend runs the same operations on a GPU. Callers choose by Device::backend at run time.
// Base layer: includes no other project header but check.h.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

struct CUstream_st;  // cudaStream_t is CUstream_st*; declared here so that CPU-only builds need no CUDA headers

// A function callable from host code and from CUDA kernels: inline everywhere, force-inlined on the device.
#if defined(__CUDACC__)
#define SPARTA_HD __host__ __device__ __forceinline__
#else
#define SPARTA_HD inline
#endif

namespace sparta {

using Stream = CUstream_st*;

enum class Backend { cpu, cuda };

struct Device {
  Backend backend = Backend::cpu;
  int gpu = -1;              // CUDA device ordinal for the cuda backend, -1 for cpu
  Stream stream = nullptr;   // the rank's compute stream (cuda backend); nullptr for cpu
  bool is_cuda() const { return backend == Backend::cuda; }
  std::string name() const;  // "cpu" or "cuda:<gpu>"
};

// True when this binary was built with CUDA support (make CUDA=1).
bool built_with_cuda();
// GPUs this process can see; 0 when built without CUDA or when no driver or device is present.
int visible_gpu_count();
// Name of GPU ordinal (from the driver), or "" without CUDA.
std::string gpu_name(int gpu);

// Makes the device current on this thread (cudaSetDevice) and creates its stream. The cpu backend touches no
// CUDA runtime call here or anywhere below, so a cpu rank never creates a CUDA context.
Device open_device(Backend backend, int gpu);
void close_device(Device& dev);

// A stream of dev besides dev.stream (a second compute stream; tests): non-blocking. cpu: nullptr, nothing made.
// destroy_stream waits for the stream's work first.
Stream create_stream(const Device& dev);
void destroy_stream(const Device& dev, Stream stream);

// A point in one stream's work that other streams can wait for: a CUDA event (cuda; on the cpu backend it holds
// nothing and every call does nothing). record(s) marks the work queued on s so far; wait_in(t) makes the work
// queued on t from now on start after the last recorded point (nothing when never recorded). Never a host wait.
class StreamEvent {
 public:
  StreamEvent() = default;
  explicit StreamEvent(const Device& dev);
  ~StreamEvent();
  StreamEvent(StreamEvent&& o) noexcept;
  StreamEvent& operator=(StreamEvent&& o) noexcept;
  StreamEvent(const StreamEvent&) = delete;
  StreamEvent& operator=(const StreamEvent&) = delete;
  void record(Stream s);
  void wait_in(Stream t);
  bool recorded() const { return recorded_; }

 private:
  void* event_ = nullptr;  // cudaEvent_t
  bool recorded_ = false;
};

// A second stream of dev that owns its stream and one event to order it against others (cuda; on the cpu
// backend it holds nothing and every call does nothing, since cpu work is done when its call returns). The
// orderings are CUDA events, never a host wait. Destruction waits for the stream's work, then destroys it.
class SideStream {
 public:
  SideStream() = default;
  explicit SideStream(const Device& dev);
  ~SideStream();
  SideStream(SideStream&& o) noexcept;
  SideStream& operator=(SideStream&& o) noexcept;
  SideStream(const SideStream&) = delete;
  SideStream& operator=(const SideStream&) = delete;
  // The stream (nullptr on the cpu backend or when default-constructed).
  Stream stream() const { return stream_; }
  // Work queued on this stream from now on starts after the work queued on `other` so far.
  void wait_for(Stream other);
  // Work queued on `other` from now on starts after the work queued on this stream so far.
  void join_into(Stream other);

 private:
  void release();
  Device dev_;
  Stream stream_ = nullptr;
  StreamEvent event_;
};

// A step's timeline: labelled points in the work of one or more streams of dev, read as milliseconds since the
// first point (cuda: timing events, so a point is when the device reached it, and a gap shows where a stream
// waited, for another stream or for the host; cpu: the host clock when the point was marked, since cpu work is
// done when its call returns). For diagnostics (EmbeddingCollection::trace); the events are made once and reused.
class StreamClock {
 public:
  explicit StreamClock(const Device& dev);
  ~StreamClock();
  StreamClock(const StreamClock&) = delete;
  StreamClock& operator=(const StreamClock&) = delete;
  void mark(Stream s, const std::string& label);
  struct Point {
    std::string label;
    double ms = 0;  // since the first point
  };
  // Every point marked since the last read, in the order marked; waits for the streams to reach them.
  std::vector<Point> read();

 private:
  Device dev_;
  std::vector<void*> events_;  // cudaEvent_t with timing, events_[i] for the i-th point since the last read
  std::vector<std::string> labels_;
  std::vector<double> host_ms_;  // cpu
};

// What this process holds through device_alloc on one device (the cpu backend's "device" memory is host
// memory, counted the same way): bytes in use now, and the most in use since the last reset_device_peak. The
// planner's memory estimate is checked against it (tests/test_planner_memory.cpp).
struct DeviceMemoryUse {
  size_t in_use = 0;
  size_t peak = 0;
};
DeviceMemoryUse device_memory_use(const Device& dev);
void reset_device_peak(const Device& dev);
// Memory the device can still give: cuda: cudaMemGetInfo's free bytes (every process's allocations already
// taken off); cpu: the host's MemAvailable (/proc/meminfo; 0 where it cannot be read).
size_t device_free_bytes(const Device& dev);

// Raw memory. cpu: 256-byte aligned host memory; cuda: cudaMalloc. Zero bytes gives nullptr.
// An allocation that fails ends the job with the bytes asked for and the device's free memory.
void* device_alloc(const Device& dev, size_t bytes);
// Frees at once: the caller guarantees that no stream still uses p. Memory that a stream may still be using
// goes through device_free_after instead, so that nothing relies on cudaFree synchronizing implicitly.
void device_free(const Device& dev, void* p);
// Frees p once last_used, the stream that last used it, has finished with it: synchronizes last_used, then
// frees. (A stream-ordered allocator would be cudaFreeAsync on last_used, without the host waiting.)
void device_free_after(const Device& dev, void* p, Stream last_used);
// Host memory for staging and prefetching. The cuda backend gets page-locked memory (fast, asynchronous
// copies); the cpu backend gets plain aligned host memory and never touches the CUDA runtime, so a cpu rank
// creates no CUDA context even where GPUs are visible. Free with the backend it was allocated for.
void* pinned_alloc(Backend backend, size_t bytes);
void pinned_free(Backend backend, void* p);

// Copies and sets on `stream` (cuda; the cpu backend ignores the stream and does them at once). Asynchronous,
// except copy_to_host, which synchronizes the stream so the host may read dst on return. copy_to_device from
// pageable host memory: the source may be reused on return (the runtime stages it), from pinned memory only
// once the stream reached the copy. Kernels and tables use these forms, with the stream of the operation.
void copy_to_device(const Device& dev, void* dst, const void* src, size_t bytes, Stream stream);
void copy_to_host(const Device& dev, void* dst, const void* src, size_t bytes, Stream stream);
void copy_on_device(const Device& dev, void* dst, const void* src, size_t bytes, Stream stream);
void memset_device(const Device& dev, void* dst, int byte, size_t bytes, Stream stream);
// Waits for all work queued on stream (no-op on cpu).
void synchronize(const Device& dev, Stream stream);

// Host conveniences (Buffer::upload/download, tests, benchmarks): the same on dev.stream.
void copy_to_device(const Device& dev, void* dst, const void* src, size_t bytes);
void copy_to_host(const Device& dev, void* dst, const void* src, size_t bytes);
void copy_on_device(const Device& dev, void* dst, const void* src, size_t bytes);
void memset_device(const Device& dev, void* dst, int byte, size_t bytes);
void synchronize(const Device& dev);

}  // namespace sparta
