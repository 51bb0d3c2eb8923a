// tool_cpu_rank_context: what a cpu-backend rank does with the CUDA runtime: it asks how many GPUs there are (as
// Context does to choose a device), opens the cpu device, allocates pinned buffers and runs an embedding table's
// train steps (forward, backward, export, load). Then it asks the driver, loaded at run time (no link against
// libcuda), whether GPU 0's primary context is active, and prints "primary context active: 0" or "... 1".
// test_cpu_rank_context runs it: a cpu rank must leave the context inactive.
//   tool_cpu_rank_context cpu   the cpu workload
//   tool_cpu_rank_context gpu   control: opens cuda:0 and allocates on it first (the context must show active)
// Exit status 2 when the driver cannot be asked (no libcuda.so.1, or cuInit fails).
#include <dlfcn.h>

#include <cstdio>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "src/embedding_table.h"

namespace {

using namespace sparta;

void cpu_workload() {
  std::printf("visible GPUs: %d\n", visible_gpu_count());
  Device dev = open_device(Backend::cpu, -1);
  {
    PinnedBuffer<int64_t> staged(Backend::cpu, 64);
    for (size_t i = 0; i < staged.size(); ++i) staged[i] = int64_t(i % 40) * 7919;
    EmbeddingTableConfig c;
    c.name = "cpu_rank";
    c.dim = 8;
    c.capacity_rows = 100;
    c.optimizer.kind = OptimizerKind::adam;
    c.max_batch_keys = 32;
    EmbeddingTable t(dev, c);
    Stream s = create_stream(dev);
    std::vector<int64_t> offsets(65);
    for (size_t i = 0; i < offsets.size(); ++i) offsets[i] = int64_t(i);
    Buffer<int64_t> off(dev, offsets), keys(dev, 64), rows(dev, 64);
    copy_to_device(dev, keys.data(), staged.data(), staged.bytes(), s);
    Buffer<float> out(dev, 64 * 8), grad(dev, std::vector<float>(64 * 8, 0.5f));
    for (int64_t step = 1; step <= 2; ++step) {
      t.pooled_forward(off.data(), keys.data(), 64, Combiner::sum, LookupMode::train, out.data(), OutputType::f32,
                       rows.data(), MissingKey::zeros, Check::deferred, s);
      t.backward_and_update(off.data(), rows.data(), 64, 64, grad.data(), Combiner::sum, step, s);  // grows
      t.check_lookups(MissingKey::zeros, s);
    }
    TableRows r = t.export_rows(s);
    EmbeddingTable u(dev, c);
    u.load_rows(r, s);
    std::printf("rows: %lld exported, %lld loaded, %lld updated\n", (long long)r.rows(), (long long)u.size(s),
                (long long)t.rows_updated(s));
    destroy_stream(dev, s);
  }
  close_device(dev);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "cpu";
  if (mode == "gpu") {
    Device dev = open_device(Backend::cuda, 0);
    Buffer<float> b(dev, 16);
    b.fill_bytes(0);
    synchronize(dev);
  }
  cpu_workload();

  // The driver API by hand: CUresult is an int, CUdevice an int; 0 is CUDA_SUCCESS.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    std::printf("no libcuda.so.1: %s\n", dlerror());
    return 2;
  }
  using Init = int (*)(unsigned);
  using DeviceGet = int (*)(int*, int);
  using PrimaryCtxGetState = int (*)(int, unsigned*, int*);
  auto cu_init = reinterpret_cast<Init>(dlsym(lib, "cuInit"));
  auto cu_device_get = reinterpret_cast<DeviceGet>(dlsym(lib, "cuDeviceGet"));
  auto cu_state = reinterpret_cast<PrimaryCtxGetState>(dlsym(lib, "cuDevicePrimaryCtxGetState"));
  if (!cu_init || !cu_device_get || !cu_state) {
    std::printf("libcuda.so.1 lacks cuInit, cuDeviceGet or cuDevicePrimaryCtxGetState\n");
    return 2;
  }
  int device = 0, active = -1;
  unsigned flags = 0;
  int rc = cu_init(0);  // initializes the driver; creates no context
  if (rc == 0) rc = cu_device_get(&device, 0);
  if (rc == 0) rc = cu_state(device, &flags, &active);
  if (rc != 0) {
    std::printf("driver call failed with CUresult %d\n", rc);
    return 2;
  }
  std::printf("primary context active: %d\n", active);
  return 0;
}
