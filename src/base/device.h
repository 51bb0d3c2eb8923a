// device.h: the device a rank drives (the CPU or one GPU), its stream, and raw memory on it.
//
// Every rank drives exactly one device. The cpu backend is a complete implementation of every kernel;
// the cuda backend runs the same operations on a GPU. Callers choose by Device::backend at run time.
// Base layer: includes no other project header but check.h.
#pragma once

#include <cstddef>
#include <string>

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

// Makes the device current on this thread (cudaSetDevice) and creates its stream.
Device open_device(Backend backend, int gpu);
void close_device(Device& dev);

// Raw memory. cpu: 256-byte aligned host memory; cuda: cudaMalloc. Zero bytes gives nullptr.
// An allocation that fails ends the job with the bytes asked for and the device's free memory.
void* device_alloc(const Device& dev, size_t bytes);
void device_free(const Device& dev, void* p);
// Host memory for staging and prefetching. The cuda backend gets page-locked memory (fast, asynchronous
// copies); the cpu backend gets plain aligned host memory and never touches the CUDA runtime, so a cpu rank
// creates no CUDA context even where GPUs are visible. Free with the backend it was allocated for.
void* pinned_alloc(Backend backend, size_t bytes);
void pinned_free(Backend backend, void* p);

// Copies between host and device memory of dev. Asynchronous on dev.stream for cuda, except
// copy_to_host, which synchronizes the stream so the host may read dst on return.
void copy_to_device(const Device& dev, void* dst, const void* src, size_t bytes);
void copy_to_host(const Device& dev, void* dst, const void* src, size_t bytes);
void copy_on_device(const Device& dev, void* dst, const void* src, size_t bytes);
void memset_device(const Device& dev, void* dst, int byte, size_t bytes);
// Waits for all work queued on dev.stream (no-op on cpu).
void synchronize(const Device& dev);

}  // namespace sparta
