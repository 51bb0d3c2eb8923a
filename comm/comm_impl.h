// comm_impl.h: the communicator's internals, shared by the files that implement them (each section below
// names its file). Not for use outside comm/.
//   setup.cpp          set-up and tear-down: MPI groups, NCCL communicators, streams; element type mappings
//   streams.cpp        the stream contract: each operation's frame (events between the caller's stream and
//                      the communication stream), copies, and scratch and staging memory in stream order
//   wait_abort.cpp     the fault-aware waits (polling NCCL errors against the timeout) and the abort
//   flat_nccl.cpp      one group's collectives (NCCL; MPI on host buffers for the cpu node group) and the flat
//                      NCCL algorithms
//   flat_mpi.cpp       the MPI pipeline (direct or staged through pinned host memory), flat MPI algorithms
//   hierarchical.cpp   the hierarchical algorithms (mode hier)
//   dispatch.cpp       the public operations: argument checks and dispatch by mode
//   check_calls.cpp    the optional check that every rank makes the same call (CommOptions::check_calls)
#pragma once

#include <mpi.h>

#if SPARTA_CUDA
#include <cuda_runtime_api.h>
#include <nccl.h>
#endif

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "src/base/buffer.h"
#include "src/base/check.h"
#include "src/base/deadline.h"
#include "comm/communicator.h"

namespace sparta {

#if SPARTA_CUDA
using CudaEvent = cudaEvent_t;
using NcclComm = ncclComm_t;
#else
using CudaEvent = void*;
using NcclComm = void*;
#endif

// Completion of work issued earlier: device work (a CUDA event), host MPI work (request lists, shared so
// that copies of a Ready see the requests complete), or nothing (already done).
struct Ready {
  CudaEvent event = nullptr;
  std::vector<std::shared_ptr<std::vector<MPI_Request>>> reqs;
};

// Ranks that talk to each other: all ranks, one node, or the ranks of one local rank across nodes.
struct Group {
  MPI_Comm mpi = MPI_COMM_NULL;
  NcclComm nccl = nullptr;
  int rank = 0, size = 1;
  std::vector<int> world_of;  // group rank → world rank, for messages
  const char* name = "world";
};

// One non-blocking MPI call of a pipeline, with the copies that stage it through pinned host memory.
// Staged steps (stage_bytes > 0) get their own slice of the staging buffer: copy_in fills it (device→host,
// on the copy stream, once `ready` is done), start posts the MPI call on it, copy_out empties it
// (host→device, on the communication stream) once the call is complete. Direct steps pass start nullptr
// and use the buffers themselves. `after` runs on the host once the step is complete (and its copy_out
// queued), in step order on every rank: it queues the next phase (NCCL inside the node).
struct Step {
  Ready ready;
  size_t stage_bytes = 0;
  std::function<void(char*)> copy_in;
  std::function<int(char*, MPI_Request*)> start;  // empty: a marker that completes at once
  std::function<void(char*)> copy_out;
  std::function<void()> after;
  std::string what;
};

// A point-to-point transfer in a group: bytes at ptr to or from group rank peer.
struct P2p {
  char* ptr;
  size_t bytes;
  int peer;
};

struct Communicator::Impl {
  Impl(const Topology& topo, const Device& dev, const CommOptions& opt);
  ~Impl();

  // ---- state
  CommOptions opt;
  Device dev;
  bool cuda = false;
  bool cuda_aware = false;     // MPI library's answer
  bool stage_always = false;   // staging=always
  int rank = 0, size = 1, node = 0, num_nodes = 1, local = 0, local_size = 1;
  bool uniform = true, node_major = true;
  std::vector<int> node_of, local_of;    // world rank → node, local rank
  std::vector<std::vector<int>> rank_at;  // [node][local] → world rank (uniform nodes)
  Group world, node_group, cross;
  std::vector<NcclComm> nccl_comms;  // every NCCL communicator, for error polling and abort
  MPI_Op op_sum_bf16 = MPI_OP_NULL, op_sum_f16 = MPI_OP_NULL;

  Stream comm_stream = nullptr, copy_stream = nullptr;
  // input_ev: the caller's stream reached the operation (recorded on it); done_ev: the communication stream
  // finished the last operation; stage_free_ev: the host-to-device copies out of the staging buffer are done;
  // sync_ev: synchronize's mark on the caller's stream.
  CudaEvent input_ev = nullptr, done_ev = nullptr, stage_free_ev = nullptr, sync_ev = nullptr;
  std::vector<CudaEvent> event_pool;
  size_t events_used = 0;
  bool stage_busy = false;
  bool copy_ordered = false;  // the copy stream waits for input_ev (queued once per operation, when needed)

  PinnedBuffer<char> stage;   // host staging for MPI transfers of device buffers
  Buffer<char> scratch;       // device (cpu: host) scratch of the hierarchical algorithms
  std::vector<char> host_tmp; // cpu backend: source copy for an in-place reduce-scatter inside the node
  std::vector<Ready> pending; // work of the current operation still to complete (waited in end_op)

  // What a failure message says about the operation: its name, and either the bytes this rank moves and its
  // peers (begin_op; formatted only on failure, to keep the path of a healthy call short) or a free text.
  std::string op_name = "set-up", op_detail;
  bool op_framed = false;  // true: the message gives op_send, op_recv, op_root; false: op_detail
  size_t op_send = 0, op_recv = 0;
  int op_root = -1;  // broadcast's root, else -1
  std::chrono::steady_clock::time_point last_progress;

  // ---- set-up (setup.cpp)
#if SPARTA_CUDA
  NcclComm make_nccl(const Group& g, const char* name);
  // eager_connect: a one-byte exchange with every member of g, waited for (see communicator.h, "Connections").
  void connect_peers(const Group& g);
  ncclDataType_t nccl_type(DataType t) const;
#endif
  MPI_Datatype mpi_type(DataType t) const;
  MPI_Op mpi_sum(DataType t) const;
  // Whether MPI goes through pinned host staging: device buffers of a non-CUDA-aware library, and every MPI
  // collective (as opposed to point-to-point) on device buffers; host buffers only with staging=always.
  bool staged(bool collective) const;

  // ---- the operation frame and stream order (streams.cpp)
  // begin_op: the communication stream waits (an event, no host sync) for the work queued on `stream` so far;
  // end_op: `stream` waits for the communication stream's work of the operation. The cpu backend ignores
  // streams (end_op waits for the node group's MPI requests instead).
  void begin_op(const char* name, Stream stream, size_t send_bytes, size_t recv_bytes, int root = -1);
  void end_op(Stream stream);
  // Before the first device-to-host copy of an operation: the copy stream waits for input_ev.
  void order_copy_stream();
#if SPARTA_CUDA
  CudaEvent record(Stream s);  // an event of the pool, recorded on s (the pool is reused per operation)
#endif
  void copy(void* dst, const void* src, size_t bytes, Stream s);
  void copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width, size_t height, Stream s);
  // Device scratch of at least `bytes` for the hierarchical algorithms. Call before the operation queues
  // work on the communication stream: growing it waits (host, fault-aware) for done_ev first.
  char* scratch_bytes(size_t bytes);
  // The pinned staging buffer, at least `bytes`, once the previous staged transfer no longer reads it.
  char* staging_bytes(size_t bytes);

  // ---- call checks (check_calls.cpp; communicator.h "Call checks")
  bool check = false;      // check_calls or SPARTA_COMM_CHECK=1 on any rank
  uint64_t calls = 0;      // calls checked so far (their number in messages)
  // Every rank compares (op, type, count, counts, root) with every other's; a difference fails the job. type: a
  // DataType, or -1 (exchange_counts, barrier); count: what must agree (0 where counts may differ by rank).
  void check_call(const char* op, int type, size_t count, const std::vector<size_t>* counts = nullptr,
                  int root = -1);
  // all_to_all_v with known counts: what each peer sends this rank equals recv_counts (after check_call).
  void check_counts(const std::vector<size_t>& send_counts, const std::vector<size_t>& recv_counts);

  // ---- fault-aware waits and the abort (wait_abort.cpp)
  void touch() { last_progress = std::chrono::steady_clock::now(); }
  void poll_health(const std::string& waiting_for);
  [[noreturn]] void fail(const std::string& why);
  // A caller's bad arguments to operation `op`, found before the operation started.
  [[noreturn]] void fail_args(const char* op, const std::string& why);
  void check_mpi(int code, const std::string& what);
  bool ready_done(Ready& r);
  void wait_ready(Ready& r, const std::string& what);
  void wait_requests(std::vector<MPI_Request>& reqs, const std::string& what);
#if SPARTA_CUDA
  bool event_done(CudaEvent ev);
  void wait_event(CudaEvent ev, const std::string& what);
  // An NCCL call's result: ncclSuccess returns at once; ncclInProgress (a non-blocking communicator still
  // working: its launch thread, or creation) is waited for; anything else fails. `what` is a callable giving
  // the call's description, formatted only when needed.
  template <class What>
  void nccl_settle(ncclResult_t r, NcclComm comm, const What& what) {
    if (r != ncclSuccess) nccl_wait_in_progress(r, comm, what());
  }
  void nccl_wait_in_progress(ncclResult_t r, NcclComm comm, const std::string& what);
#endif

  // ---- the MPI pipeline (flat_mpi.cpp)
  void run_steps(std::vector<Step>& steps);
  void add_send(std::vector<Step>& steps, const Group& g, const char* src, size_t bytes, int peer, int tag,
                const Ready& ready, bool stg);
  void add_recv(std::vector<Step>& steps, const Group& g, char* dst, size_t bytes, int peer, int tag, bool stg);
  void add_all_reduce(std::vector<Step>& steps, const Group& g, const char* send, char* recv, size_t count,
                      DataType t, const Ready& ready, bool stg);
  void add_reduce_scatter(std::vector<Step>& steps, const Group& g, const char* send, char* recv, size_t rc,
                          DataType t, const Ready& ready, bool stg);
  void add_all_gather_v(std::vector<Step>& steps, const Group& g, const char* send, char* recv,
                        const std::vector<size_t>& counts, DataType t, bool stg);
  void add_broadcast(std::vector<Step>& steps, const Group& g, char* buf, size_t bytes, int root, size_t chunk,
                     bool stg);

  // ---- one group's collectives, queued (NCCL on the communication stream) or posted (MPI, host buffers)
  // (flat_nccl.cpp)
  Ready group_p2p(const Group& g, const std::vector<P2p>& sends, const std::vector<P2p>& recvs, int tag);
  Ready group_reduce_scatter(const Group& g, const char* send, char* recv, size_t count, DataType t);
  Ready group_all_gather(const Group& g, const char* send, char* recv, size_t count, DataType t);
  Ready group_all_reduce(const Group& g, const char* send, char* recv, size_t count, DataType t);
  Ready group_broadcast(const Group& g, char* buf, size_t bytes, int root);

  // ---- flat algorithms over one group (group rank order = the order of counts and blocks): NCCL
  // (flat_nccl.cpp), MPI (flat_mpi.cpp), and the choice between them (dispatch.cpp: NCCL when use_nccl)
  void nccl_all_to_all_v(const Group& g, const char* send, const std::vector<size_t>& scount, char* recv,
                         const std::vector<size_t>& rcount, DataType t);
  void nccl_all_gather_v(const Group& g, const char* send, char* recv, const std::vector<size_t>& counts,
                         DataType t);
  void mpi_all_to_all_v(const Group& g, const char* send, const std::vector<size_t>& scount, char* recv,
                        const std::vector<size_t>& rcount, DataType t);
  void mpi_all_reduce(const Group& g, const char* send, char* recv, size_t count, DataType t);
  void mpi_reduce_scatter(const Group& g, const char* send, char* recv, size_t rc, DataType t);
  void mpi_all_gather_v(const Group& g, const char* send, char* recv, const std::vector<size_t>& counts,
                        DataType t);
  void mpi_broadcast(const Group& g, char* buf, size_t bytes, int root);
  void flat_all_to_all_v(const Group& g, bool use_nccl, const char* send, const std::vector<size_t>& scount,
                         char* recv, const std::vector<size_t>& rcount, DataType t);
  void flat_all_reduce(const Group& g, bool use_nccl, const char* send, char* recv, size_t count, DataType t);
  void flat_reduce_scatter(const Group& g, bool use_nccl, const char* send, char* recv, size_t rc, DataType t);
  void flat_all_gather_v(const Group& g, bool use_nccl, const char* send, char* recv,
                         const std::vector<size_t>& counts, DataType t);
  void flat_broadcast(const Group& g, bool use_nccl, char* buf, size_t bytes, int root);

  // ---- hierarchical algorithms (hierarchical.cpp)
  void hier_all_to_all_v(const char* send, const std::vector<size_t>& scount, char* recv,
                         const std::vector<size_t>& rcount, DataType t, bool fixed);
  void hier_all_reduce(const char* send, char* recv, size_t count, DataType t);
  void hier_reduce_scatter(const char* send, char* recv, size_t rc, DataType t);
  void hier_all_gather_v(const char* send, char* recv, const std::vector<size_t>& counts, DataType t);
  void hier_broadcast(char* buf, size_t bytes, int root);
};

// Element offsets of packed blocks: displs[p] = counts[0] + ... + counts[p-1].
inline std::vector<size_t> prefix_sums(const std::vector<size_t>& counts) {
  std::vector<size_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

// "the cross group (world ranks 1,3)": names the ranks a collective waits for, in messages (wait_abort.cpp).
std::string members(const Group& g);

constexpr int kTag = 7100;                  // MPI tags of this layer start here
constexpr size_t kDirectChunk = 1u << 30;  // bytes per MPI call on unstaged buffers (int counts)

}  // namespace sparta
