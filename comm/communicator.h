// communicator.h: collective communication for one rank: NCCL inside a node, MPI between nodes, and the
// hierarchical algorithms that combine them. One Communicator per rank, built collectively from the rank's
// Topology and Device; buffers are device memory (cuda) or host memory (cpu); counts are in elements of a
// DataType. Every operation is collective over the world: every rank calls them in the same order.
//
// Modes (CommOptions::mode):
//   nccl  flat NCCL over all ranks (cuda only).
//   mpi   flat MPI. Device buffers go to MPI directly where the library is CUDA-aware at run time
//         (point-to-point only); otherwise through pinned host memory in chunks of chunk_bytes, the copies of
//         one chunk overlapping the transfer of the next (the bf16/fp16 sums are host-side MPI operations).
//   hier  NCCL (cpu: MPI) inside each node, MPI between nodes, running at once where the algorithm allows;
//         every node must have the same number of ranks.
//
// Hierarchical algorithms (N nodes of L ranks), after HugeCTR's: the all-to-all-v moves, per destination node,
// the node's data to the local rank that faces that node (NCCL), which sends it across in one message per
// source (MPI) straight into the receiver's buffer, so bytes leave a node once and need no reordering pass;
// all-reduce is reduce-scatter in the node, all-reduce across nodes, all-gather in the node, chunk by chunk
// so that NCCL and MPI overlap; reduce-scatter, all-gather(-v) and broadcast split the same way.
//
// Streams: an operation takes the stream whose work produces its input and consumes its output (cpu: ignored).
// The communicator's own streams wait for that stream's earlier work and that stream waits for the operation,
// both by CUDA events, never a host sync. Operations run one after another on the communication stream in
// call order. Host waits: NCCL calls return once queued; MPI calls return once this rank's transfers are done
// (after waiting for the device data they read); growing scratch or staging memory waits for earlier use.
// Before any other host sync of a stream (a download), call synchronize(stream): its wait notices a failed peer.
//
// Connections (eager_connect, the default): every NCCL ring, tree and peer channel is connected while the
// communicator is built (NCCL_RUNTIME_CONNECT=0 unless the environment sets it), not inside a later call where
// the set-up can wait on a peer's running kernels. Costs memory and set-up time (experiments/NOTES_comm.md).
//
// Call checks (check_calls or SPARTA_COMM_CHECK=1, for debugging a hang): before each call the ranks compare
// the operation, type and counts over MPI; a difference ends the job naming both ranks' calls.
//
// Faults: every wait polls ncclCommGetAsyncError and gives up after timeout_s without progress, aborting the
// NCCL communicators and then the job (MPI_Abort) with a message naming the operation, mode, ranks and bytes.
// Counts that disagree between peers are the caller's bug: the call checks name them, else the timeout ends it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "src/base/device.h"
#include "comm/dtype.h"
#include "comm/topology.h"

namespace sparta {

enum class CommMode { nccl, mpi, hier };
// "nccl" | "mpi" | "hier"; throws sparta::Error naming the value otherwise.
CommMode parse_comm_mode(const std::string& name);
const char* comm_mode_name(CommMode mode);

struct CommOptions {
  CommMode mode = CommMode::hier;
  double timeout_s = 300;           // a wait that makes no progress this long ends the job
  size_t chunk_bytes = 8u << 20;    // staging chunk (device↔host copies) and hierarchical pipeline chunk
  std::string staging = "auto";     // auto: stage device buffers when MPI is not CUDA-aware (or for bf16/fp16
                                    // sums); always: stage every MPI transfer, host buffers too (tests the
                                    // pipeline on the cpu backend)
  // NCCL connects at construction (true) rather than on first use (false). See "Connections" above.
  bool eager_connect = true;
  // NCCL communicators in NCCL's blocking mode (config.blocking = 1, the default): each call launches its work in
  // the calling thread. false: non-blocking, where NCCL launches from a thread of its own (slower per call,
  // experiments/NOTES_comm.md run 3) and every NCCL call, creation included, is waited for under the timeout.
  bool nccl_blocking = true;
  // Checks every call against the other ranks' before it starts (see "Call checks" above); also turned on by the
  // environment variable SPARTA_COMM_CHECK=1. On for the communicator when any rank asks for it.
  bool check_calls = false;
};

class Communicator {
 public:
  // Collective over topo.world. Creates the NCCL communicators the mode needs (node: hier; all ranks: nccl),
  // blocking or not (nccl_blocking), connected (eager_connect), with the unique id made on the group's first rank
  // and broadcast over MPI.
  // Throws sparta::Error (on every rank alike) for: mode nccl on the cpu backend, hier on nodes of different
  // sizes, ranks with different backends, timeout_s <= 0, chunk_bytes == 0, an unknown staging value.
  // dev gives the backend and the GPU; its stream plays no part (each operation names its own).
  // The destructor waits (host, fault-aware) for every operation's device work; with NCCL communicators it is
  // collective: the ranks meet in a barrier (under the timeout) before NCCL is finalized.
  Communicator(const Topology& topo, const Device& dev, const CommOptions& opt = CommOptions());
  ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  CommMode mode() const;
  int rank() const;
  int size() const;
  bool cuda_aware_mpi() const;  // what the MPI library reported at run time
  // One line: mode, backend, nodes × ranks, MPI CUDA-awareness, staging.
  std::string describe() const;

  // Counts: recv_counts[p] = send_counts[q] of rank p for q = this rank (an MPI all-to-all of the counts).
  // Host only: host vectors in and out, no device memory, hence no stream; synchronizes the host (returns
  // once every rank's counts arrived).
  std::vector<size_t> exchange_counts(const std::vector<size_t>& send_counts);

  // All-to-all with variable counts ("counts known"): send holds send_counts[p] elements for each rank p
  // in rank order, recv receives recv_counts[p] elements from each p in rank order. Zeros allowed.
  // Not in place. The counts must agree between peers. Host: see "Host waits".
  void all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                    const std::vector<size_t>& recv_counts, DataType type, Stream stream);
  // All-to-all with variable counts ("exchange counts"): exchanges the counts first and returns recv_counts.
  // recv must hold recv_capacity elements; receiving more ends the job with a message naming the counts.
  // Host: synchronizes for the counts (exchange_counts), then as "Host waits".
  std::vector<size_t> all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                   size_t recv_capacity, DataType type, Stream stream);
  // Fixed all-to-all: count elements to and from every rank. send, recv: [size][count]. Not in place.
  // Host: see "Host waits".
  void all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream);

  // recv = block `rank` of the element-wise sum over ranks of send. send: [size][recv_count], recv:
  // [recv_count]. Not in place. Host: see "Host waits".
  void reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, Stream stream);
  // recv = element-wise sum over ranks of send ([count]); send == recv is allowed. Host: see "Host waits".
  void all_reduce(const void* send, void* recv, size_t count, DataType type, Stream stream);
  // recv: [size][count], block p = send of rank p. send == recv + rank*count is allowed.
  // Host: see "Host waits".
  void all_gather(const void* send, void* recv, size_t count, DataType type, Stream stream);
  // Variable counts: send holds counts[rank] elements; recv: rank p's counts[p] elements, in rank order.
  // send == recv + (sum of counts before rank) is allowed. counts must be the same on every rank.
  // Host: see "Host waits".
  void all_gather_v(const void* send, void* recv, const std::vector<size_t>& counts, DataType type,
                    Stream stream);
  // buf ([count]) of rank root into buf of every rank. Host: see "Host waits".
  void broadcast(void* buf, size_t count, DataType type, int root, Stream stream);
  // Host barrier over all ranks (with the timeout). Synchronizes the host with the other ranks; does not
  // wait for queued device work (no stream).
  void barrier();

  // The host waits for the work queued on `stream` so far (every operation issued on it included), polling
  // NCCL errors against the timeout: a failed peer ends the job instead of hanging it. cpu: returns at once.
  void synchronize(Stream stream);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

}  // namespace sparta
