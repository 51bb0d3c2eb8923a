// context.cpp: see context.h.
#include "src/context.h"

#include <mpi.h>

#include <vector>

#include "src/base/check.h"
#include "src/base/log.h"
#include "src/base/deadline.h"

namespace sparta {

MpiSession::MpiSession(int* argc, char*** argv) {
  MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided_));
  // Errors come back as codes and are checked (MPI_CHECK), so every failure names its call.
  MPI_CHECK(MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  char host[MPI_MAX_PROCESSOR_NAME] = {0};
  int len = 0;
  MPI_Get_processor_name(host, &len);
  set_identity(rank, std::string(host, len));
  // Lets a peer whose wait timed out tell this rank, busy outside any wait, from a stopped one (deadline.h).
  if (provided_ == MPI_THREAD_MULTIPLE) start_roll_call_responder();
}

MpiSession::~MpiSession() {
  stop_roll_call_responder();
  int down = 0;
  MPI_Finalized(&down);
  if (!down) MPI_Finalize();
}

DeviceChoice choose_device(const std::string& device, int host_rank, int host_size, int gpus) {
  if (device == "cpu")
    return {Backend::cpu, -1, gpus > 0 ? strprintf("cpu (--device cpu, though this process sees %d GPU(s))", gpus)
                                       : std::string("cpu (--device cpu)")};
  const bool known = device == "cuda" || device == "auto";
  if (!known) throw Error("--device: expected cpu, cuda or auto, found '" + device + "'");
  if (gpus == 1)
    return {Backend::cuda, 0,
            strprintf("cuda: each rank uses the one GPU it sees (GPU 0 here; host-local rank %d of %d; a per-rank "
                      "binding such as srun --gpus-per-task=1 or CUDA_VISIBLE_DEVICES%s)",
                      host_rank, host_size, host_size > 1 ? ", or ranks sharing one GPU" : "")};
  if (gpus > host_rank && (device == "cuda" || gpus >= host_size))
    return {Backend::cuda, host_rank,
            strprintf("cuda: GPU %d of the %d this process sees, by host-local rank %d of %d", host_rank, gpus,
                      host_rank, host_size)};
  if (device == "cuda") {
    SPARTA_REQUIRE(gpus > 0, "--device cuda: this process sees no GPU (no driver, no device, or CUDA_VISIBLE_DEVICES "
                   "hides them); host-local rank %d", host_rank);
    throw Error(strprintf("--device cuda: host-local rank %d needs GPU %d, but this process sees %d GPU(s) (give "
                          "each rank one GPU, e.g. srun --gpus-per-task=1, or run at most %d ranks per host)",
                          host_rank, host_rank, gpus, gpus));
  }
  if (gpus == 0) return {Backend::cpu, -1, "cpu: this process sees no GPU"};
  return {Backend::cpu, -1,
          strprintf("cpu: %d ranks on this host but %d GPU(s) visible to each, too few for one per rank (run at "
                    "most %d ranks per host, bind one GPU per rank, or pass --device cpu)",
                    host_size, gpus, gpus)};
}

Context::Context(const ContextOptions& opt) : opt_(opt) {
  try {
    topo_ = make_topology(MPI_COMM_WORLD, opt.ranks_per_node);
    const int gpus = visible_gpu_count();
    DeviceChoice c = choose_device(opt.device, topo_.host_rank, topo_.host_size, gpus);
    // Rank 0 says what auto chose (the others chose alike, unless hosts differ); a warning where GPUs go unused
    // (--device cpu is a choice, and programs that need no GPU, such as sparta-convert, make it).
    if (topo_.rank == 0 && opt.device == "auto" && c.backend == Backend::cpu && gpus > 0)
      LOG_WARN("device (--device auto): %s; GPUs are visible but the cpu backend runs", c.reason.c_str());
    else if (topo_.rank == 0 && opt.device == "auto")
      LOG_INFO("device (--device auto): %s", c.reason.c_str());
    device_ = open_device(c.backend, c.gpu);
  } catch (const Error& e) {
    SPARTA_FATAL("%s", e.what());
  }
}

Context::~Context() {
  close_device(device_);
  free_topology(topo_);
}

std::string Context::describe() const {
  std::string mine = strprintf("rank %d/%d host %s node %d/%d local %d/%d device %s%s%s", topo_.rank, topo_.size,
                               topo_.hostname.c_str(), topo_.node, topo_.num_nodes, topo_.local_rank,
                               topo_.local_size, device_.name().c_str(), device_.is_cuda() ? " " : "",
                               device_.is_cuda() ? gpu_name(device_.gpu).c_str() : "");
  int len = static_cast<int>(mine.size());
  std::vector<int> lens(topo_.size);
  timed_gather(&len, 1, MPI_INT, lens.data(), 1, 0, topo_.world, "context description (lengths)");
  std::vector<int> displs(topo_.size, 0);
  int total = 0;
  for (int r = 0; r < topo_.size; ++r) displs[r] = total, total += lens[r];
  std::vector<char> all(total > 0 ? total : 1);
  timed_gatherv(mine.data(), len, MPI_CHAR, all.data(), lens.data(), displs.data(), 0, topo_.world,
                "context description");
  if (topo_.rank != 0) return "";
  std::string out;
  for (int r = 0; r < topo_.size; ++r) out += std::string(all.data() + displs[r], lens[r]) + "\n";
  return out;
}

}  // namespace sparta
