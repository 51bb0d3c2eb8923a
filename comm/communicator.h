// communicator.h: collective communication for one rank: NCCL inside a node, MPI between nodes, and the
// hierarchical all-to-all that combines them.
//
// One Communicator per rank, built (collectively) from the rank's Topology and Device. Buffers are device
// memory on the cuda backend and host memory on the cpu backend; counts are in elements of a DataType.
//
// Modes (CommOptions::mode, chosen at run time):
//   nccl  flat NCCL over all ranks (cuda backend only).
//   mpi   flat MPI over all ranks. Point-to-point transfers (all-to-all) of device buffers go to MPI directly
//         when the library says at run time that it is CUDA-aware (MPIX_Query_cuda_support); otherwise, and
//         for MPI collectives on device buffers (all-reduce, reduce-scatter, all-gather, broadcast: some
//         libraries' non-blocking collectives reduce and copy on the host, and the bf16/fp16 sums are
//         user-defined MPI operations that run on the host), through pinned host memory in chunks of
//         chunk_bytes: the device→host copy of chunk k+1 runs while chunk k is on the wire, and host→device
//         copies of what arrived run while later chunks travel.
//   hier  NCCL (cuda) or MPI on the node communicator (cpu) inside each node, MPI between nodes, the two
//         running at once where the algorithm allows. Nodes must all have the same number of ranks (else a
//         sparta::Error at construction). One node: flat inside it; one rank per node: flat MPI across nodes.
//
// Hierarchical algorithms (N nodes of L ranks; rank (n, j) is local rank j of node n; "cross" = the ranks
// with one local rank, one per node; the world order of ranks may be any, blocks land where the world order
// puts them):
//   all-to-all-v  (after HugeCTR's hierarchical all-to-all)
//     0. counts: each rank learns, from its node peers l, c[l][m] = what (n,l) sends to (m,j) for every
//        node m (one small MPI all-to-all on the node communicator; skipped for the fixed all-to-all).
//     1. intra-node, one NCCL group per destination node m, remote nodes first (m = n+1, ..., n-1, then n):
//        (n,j) sends to each node peer l what it has for (m,l); it receives from l what l has for (m,j)
//        into a scratch buffer [m][l] (for m = n straight into the receive buffer: that data has arrived).
//     2. inter-node, MPI between (n,j) and (m,j): as soon as group m is done (a CUDA event), (n,j) sends
//        to (m,j) the L pieces it holds for it (its own piece straight from the send buffer), one message
//        per source l (tag l), which (m,j) receives straight into its receive buffer at the position of
//        source (n,l). So NCCL moves the next node's data while MPI sends the previous one's, and no
//        reordering pass is needed. Each rank sends L·N messages of the node-aggregated data instead of
//        W messages over the network; bytes leaving a node cross it once.
//   all-reduce: the buffer is cut into chunks of ~chunk_bytes (L shards each); per chunk: NCCL
//     reduce-scatter in the node → MPI all-reduce of this rank's shard with its cross peers → NCCL in-place
//     all-gather in the node. All reduce-scatters are queued first, so NCCL reduces chunk k+1 while MPI
//     sums chunk k. The count % L tail: NCCL all-reduce in the node, then MPI all-reduce across nodes.
//   reduce-scatter: NCCL reduce-scatter in the node of each destination node's L blocks (rank (n,j) gets
//     the node's partial sum of block (m,j) for every m) → MPI reduce-scatter across nodes of those N
//     partial blocks. (Blocks are first packed node by node when the world order is not node-major.)
//   all-gather(-v): MPI across nodes first ((n,j) gets block (m,j) of every node), then per node m, as soon
//     as its block arrived, an NCCL group that gives every node peer l block (m,j) and takes (m,l).
//   broadcast from (nr, jr): in chunks, MPI broadcast among the ranks with local rank jr, each chunk then
//     NCCL-broadcast inside every node from jr as soon as it arrived.
//
// Streams (the contract of every operation that moves buffers): the operation takes the stream it runs on,
// the stream whose work produces its input and consumes its output (cuda backend; the cpu backend ignores
// streams: pass nullptr or any value). The communicator's own streams (communication, copies) start after
// the work queued on that stream before the call, and that stream continues after the operation's device
// work: both through CUDA events, never a host sync. So work queued on the stream after the call sees the
// results; until the stream reaches them, keep inputs unchanged and outputs unread. The host sees them after
// synchronize(stream). Different operations may name different streams; they still run one after another
// on the communication stream, in the order they were called.
//
// Host waits (cuda backend; on the cpu backend every operation is complete when it returns):
//   - NCCL (mode nccl; mode hier on one node): the call queues the work and returns. With nccl_blocking (the
//     default) NCCL launches in the calling thread, which with eager connections never waits for a peer; a
//     non-blocking communicator reports ncclInProgress until NCCL's own thread has queued the work, and the host
//     waits for that.
//   - MPI (mode mpi; mode hier between nodes): the host drives MPI inside the call and returns once this
//     rank's transfers are complete, i.e. after its peers took part. Before that it waits for what MPI
//     reads: staged, the device-to-host copies of the input (queued after the stream's earlier work);
//     direct (CUDA-aware point-to-point), the stream's earlier work itself. Host-to-device copies of what
//     arrived, and NCCL work inside the node, are queued and not waited for.
//   - Memory: the first hierarchical all-to-all or reduce-scatter that needs more scratch than any before
//     waits for the earlier operations to finish before the old scratch is freed; a staged transfer waits
//     for the previous one's host-to-device copies before it reuses (or regrows) the staging buffer.
// Before a host sync of the stream by other means (a download, cudaStreamSynchronize), call synchronize:
// it is the wait that notices a failed peer and ends the job instead of hanging.
//
// Connections (cuda backend; NCCL communicators): with eager_connect (the default) every connection a later
// operation can need is made while the communicator is built, when all ranks are there and no NCCL work is in
// flight: the rings and trees of the collectives (NCCL_RUNTIME_CONNECT=0, set for the process unless the
// environment already sets it; NCCL reads it once per process) and the point-to-point channels to every peer (one
// small exchange with each). Made on first use instead, a connection is set up inside a later operation while
// the peer may already run its NCCL kernels for it and for operations queued earlier; setting up means
// allocating and mapping memory, on this rank and through the peer's NCCL proxy thread, and that can wait for
// the kernels the peer is running, which wait for this rank (suspected of a hang that depends on timing; not
// confirmed). The cost is memory, the buffers of every algorithm and peer (some hundreds of MiB per GPU at 8
// ranks), and set-up time: about 2.5 s per communicator on 2 H200s, against 0.3 s connecting on first use.
//
// Call checks (check_calls, or SPARTA_COMM_CHECK=1; for debugging a job that hangs or computes garbage): before
// each call (every operation, exchange_counts and barrier included) the ranks compare, over MPI on the host, what
// they are about to call: the operation, the element type, the count (all-reduce, reduce-scatter, fixed
// all-to-all, broadcast and its root), the counts of all_gather_v, and for all_to_all_v with known counts what
// every peer sends this rank against what this rank expects. Any difference ends the job on every rank with a
// message naming the call's number, and both ranks' calls (or the peer's count and this rank's), instead of the
// hang or the corrupt data it leads to. Costs a host round trip per call.
//
// Faults: every wait (CUDA events, a non-blocking NCCL call's ncclInProgress, MPI requests) polls
// ncclCommGetAsyncError and gives up after timeout_s without progress: it then aborts the NCCL communicators
// and ends the job (MPI_Abort) with a message naming the operation, the mode, this rank and its peers, and the
// bytes this rank sends and receives. MPI calls return codes, which are checked. With blocking NCCL
// communicators (the default) the NCCL calls themselves are not under the timeout: creation waits for every
// rank of the group (all of which have just answered over MPI), and a launch waits only for NCCL's queue of
// work to the GPU, which the host's regular waits keep short; the device work they queue is waited for like any
// other. Inconsistent counts between peers (what p says it sends to q ≠ what q expects from p) are a caller's
// bug: under call checks it ends the job naming both; otherwise it ends by the timeout at the latest.
// Operations are collective over the world: every rank calls them in the same order.
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
  // the calling thread and returns once it is queued. false: non-blocking, where NCCL hands each call's launch to
  // a thread of its own (about 15 us more per call, measured) and every NCCL call, creation included, is waited
  // for with the timeout. See "Host waits" and "Faults".
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
