// context.h: the per-rank context: MPI start-up, this rank's place in the job, and the device it drives.
//
// Start-up order (the same in every program and MPI test): MPI_Init_thread → topology (host, node) →
// device choice from the host-local rank → cudaSetDevice and a stream. The communicator (comm/) is built on
// top of this by those who need it.
#pragma once

#include <string>

#include "src/base/buffer.h"
#include "src/base/device.h"
#include "comm/topology.h"

namespace sparta {

// Owns MPI's lifetime: MPI_Init_thread in the constructor (asking for MPI_THREAD_MULTIPLE), MPI_Finalize in
// the destructor. One per process, first thing in main.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  int thread_level() const { return provided_; }

 private:
  int provided_ = 0;
};

struct ContextOptions {
  std::string device = "auto";  // cpu | cuda | auto (a GPU per rank where every rank can have one, else cpu)
  int ranks_per_node = 0;       // 0: one node per host; k: emulate nodes of k ranks (see topology.h)
};

// Which backend and GPU a rank gets, and why (rank 0 prints it). Pure, so the mapping is testable without GPUs.
// gpus is what this process sees (CUDA_VISIBLE_DEVICES applied), host_rank and host_size its place among the
// ranks of its host:
//   cpu  → cpu.
//   cuda → one visible GPU: that one (a per-rank binding such as srun --gpus-per-task=1, or
//          CUDA_VISIBLE_DEVICES set per rank); several: GPU host_rank (error when there are not that many);
//          none: an error.
//   auto → cuda as above when every rank of the host gets a GPU that way (one visible, or at least host_size),
//          else cpu (with a reason that says how many GPUs and ranks there are).
// Throws sparta::Error for an unknown device name or a cuda request it cannot meet.
struct DeviceChoice {
  Backend backend;
  int gpu;
  std::string reason;  // what was chosen and why, for the log
};
DeviceChoice choose_device(const std::string& device, int host_rank, int host_size, int gpus);

class Context {
 public:
  // Collective over MPI_COMM_WORLD. Bad options are reported by every rank (they all see them) and end the job.
  explicit Context(const ContextOptions& opt = ContextOptions());
  ~Context();
  Context(const Context&) = delete;
  Context& operator=(const Context&) = delete;

  const Topology& topo() const { return topo_; }
  const Device& device() const { return device_; }
  int rank() const { return topo_.rank; }
  int world() const { return topo_.size; }
  bool is_root() const { return topo_.rank == 0; }
  const ContextOptions& options() const { return opt_; }
  // One line per rank, gathered to rank 0: host, node, local rank, device.
  std::string describe() const;

 private:
  ContextOptions opt_;
  Topology topo_;
  Device device_;
};

}  // namespace sparta
