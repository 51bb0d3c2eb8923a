// communicator.cpp: see communicator.h. Set-up (MPI groups, NCCL communicators, streams), the waits that
// poll for errors against the timeout, the failure path, the MPI pipeline (direct or staged through pinned
// host memory), each group's collectives, the flat algorithms and the public operations.
// The hierarchical algorithms are in hierarchical.cpp.
#include "comm/comm_impl.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_Query_cuda_support
#endif

#include <algorithm>
#include <climits>
#include <cstring>
#include <numeric>
#include <thread>

#include "src/base/log.h"

namespace sparta {

CommMode parse_comm_mode(const std::string& name) {
  if (name == "nccl") return CommMode::nccl;
  if (name == "mpi") return CommMode::mpi;
  if (name == "hier") return CommMode::hier;
  throw Error("communication mode: expected nccl, mpi or hier, found '" + name + "'");
}

const char* comm_mode_name(CommMode mode) {
  switch (mode) {
    case CommMode::nccl: return "nccl";
    case CommMode::mpi: return "mpi";
    case CommMode::hier: return "hier";
  }
  return "?";
}

std::vector<size_t> prefix_sums(const std::vector<size_t>& counts) {
  std::vector<size_t> d(counts.size(), 0);
  for (size_t i = 1; i < counts.size(); ++i) d[i] = d[i - 1] + counts[i - 1];
  return d;
}

namespace {

// MPI sums of 16-bit floats: widen, add, round to nearest even (what NCCL does per addition).
void sum_bf16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_bf16(bf16_to_float(a[i]) + bf16_to_float(b[i]));
}

void sum_f16(void* in, void* inout, int* len, MPI_Datatype*) {
  const uint16_t* a = static_cast<const uint16_t*>(in);
  uint16_t* b = static_cast<uint16_t*>(inout);
  for (int i = 0; i < *len; ++i) b[i] = float_to_f16(f16_to_float(a[i]) + f16_to_float(b[i]));
}

// The MPI library's run-time answer to "may I pass device pointers?".
bool query_cuda_aware() {
#if defined(OMPI_HAVE_MPI_EXT_CUDA) && OMPI_HAVE_MPI_EXT_CUDA
  return MPIX_Query_cuda_support() == 1;
#elif defined(MPICH_NUMVERSION) && MPICH_NUMVERSION >= 40000000
  return MPIX_Query_cuda_support() == 1;
#else
  return false;
#endif
}

std::string mib(size_t bytes) { return strprintf("%.3g MiB", bytes / 1048576.0); }

// "the cross group (world ranks 1,3)": names the ranks a collective waits for.
std::string members(const Group& g) {
  std::string list;
  for (size_t i = 0; i < g.world_of.size() && i < 16; ++i) list += (i ? "," : "") + std::to_string(g.world_of[i]);
  if (g.world_of.size() > 16) list += ",...";
  return strprintf("the %s group (world ranks %s)", g.name, list.c_str());
}

}  // namespace

// ---------------------------------------------------------------------------------------------------------
// Set-up and tear-down

Communicator::Impl::Impl(const Topology& topo, const Device& d, const CommOptions& o) : opt(o), dev(d) {
  cuda = dev.is_cuda();
  rank = topo.rank, size = topo.size, node = topo.node, num_nodes = topo.num_nodes;
  local = topo.local_rank, local_size = topo.local_size, uniform = topo.uniform;
  touch();

  // What every rank must agree on is gathered first, so that a bad set-up throws the same error everywhere.
  int lo[2] = {cuda ? 1 : 0, local_size}, hi[2] = {cuda ? 1 : 0, local_size};
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, lo, 2, MPI_INT, MPI_MIN, topo.world));
  MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, hi, 2, MPI_INT, MPI_MAX, topo.world));
  SPARTA_REQUIRE(opt.timeout_s > 0, "communicator timeout: expected seconds > 0, found %g", opt.timeout_s);
  SPARTA_REQUIRE(opt.chunk_bytes > 0 && opt.chunk_bytes <= kDirectChunk,
                 "communicator chunk_bytes: expected 1 to %zu, found %zu", kDirectChunk, opt.chunk_bytes);
  SPARTA_REQUIRE(opt.staging == "auto" || opt.staging == "always",
                 "communicator staging: expected auto or always, found '%s'", opt.staging.c_str());
  SPARTA_REQUIRE(lo[0] == hi[0],
                 "communicator: every rank must drive the same backend, but some ranks have a GPU and some run on "
                 "the cpu (a host with fewer GPUs than ranks under --device auto?)");
  SPARTA_REQUIRE(opt.mode != CommMode::nccl || cuda,
                 "communication mode nccl needs the cuda backend (a GPU per rank); this job runs on the cpu "
                 "backend: use mode mpi or hier");
  SPARTA_REQUIRE(opt.mode != CommMode::hier || lo[1] == hi[1],
                 "communication mode hier needs the same number of ranks on every node, found nodes of %d to %d "
                 "ranks (%d ranks in %d nodes; choose ranks_per_node dividing the ranks per host, or use mode "
                 "mpi or nccl)",
                 lo[1], hi[1], size, num_nodes);
  stage_always = opt.staging == "always";

  MPI_CHECK(MPI_Comm_dup(topo.world, &world.mpi));
  MPI_CHECK(MPI_Comm_dup(topo.node_comm, &node_group.mpi));
  MPI_CHECK(MPI_Comm_dup(topo.cross_comm, &cross.mpi));
  world.rank = rank, world.size = size, world.name = "world";
  node_group.rank = local, node_group.size = local_size, node_group.name = "node";
  cross.rank = node, cross.name = "cross";
  MPI_CHECK(MPI_Comm_size(cross.mpi, &cross.size));

  int mine[2] = {node, local};
  std::vector<int> all(2 * size);
  MPI_CHECK(MPI_Allgather(mine, 2, MPI_INT, all.data(), 2, MPI_INT, world.mpi));
  node_of.resize(size), local_of.resize(size), world.world_of.resize(size);
  for (int r = 0; r < size; ++r) node_of[r] = all[2 * r], local_of[r] = all[2 * r + 1], world.world_of[r] = r;
  node_group.world_of.resize(local_size);
  cross.world_of.resize(cross.size);
  MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, node_group.world_of.data(), 1, MPI_INT, node_group.mpi));
  MPI_CHECK(MPI_Allgather(&rank, 1, MPI_INT, cross.world_of.data(), 1, MPI_INT, cross.mpi));
  if (uniform) {
    rank_at.assign(num_nodes, std::vector<int>(local_size, -1));
    for (int r = 0; r < size; ++r) rank_at[node_of[r]][local_of[r]] = r;
    for (int r = 0; r < size; ++r) node_major = node_major && r == node_of[r] * local_size + local_of[r];
  }

  cuda_aware = cuda && query_cuda_aware();
  MPI_CHECK(MPI_Op_create(&sum_bf16, 1, &op_sum_bf16));
  MPI_CHECK(MPI_Op_create(&sum_f16, 1, &op_sum_f16));

#if SPARTA_CUDA
  if (cuda) {
    CUDA_CHECK(cudaSetDevice(dev.gpu));
    int least = 0, greatest = 0;
    CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    cudaStream_t s;
    // Communication first: its kernels are small and others wait for them.
    CUDA_CHECK(cudaStreamCreateWithPriority(&s, cudaStreamNonBlocking, greatest));
    comm_stream = s;
    CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    copy_stream = s;
    for (CudaEvent* e : {&input_ev, &done_ev, &stage_free_ev})
      CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    if (opt.mode == CommMode::nccl) world.nccl = make_nccl(world, "sparta-world");
    if (opt.mode == CommMode::hier && local_size > 1) node_group.nccl = make_nccl(node_group, "sparta-node");
  }
#endif
  op_name = "the first operation";
}

Communicator::Impl::~Impl() {
#if SPARTA_CUDA
  if (cuda) {
    op_name = "shutdown";
    touch();
    wait_event(done_ev, "operations still queued on the communication stream");
    for (NcclComm c : nccl_comms) {
      touch();
      nccl_settle(ncclCommFinalize(c), c, "ncclCommFinalize");
      ncclCommDestroy(c);
    }
    nccl_comms.clear();
    for (CudaEvent e : event_pool) cudaEventDestroy(e);
    for (CudaEvent e : {input_ev, done_ev, stage_free_ev}) cudaEventDestroy(e);
    cudaStreamDestroy(comm_stream);
    cudaStreamDestroy(copy_stream);
  }
#endif
  MPI_Op_free(&op_sum_bf16);
  MPI_Op_free(&op_sum_f16);
  for (MPI_Comm* c : {&cross.mpi, &node_group.mpi, &world.mpi})
    if (*c != MPI_COMM_NULL) MPI_Comm_free(c);
}

#if SPARTA_CUDA
NcclComm Communicator::Impl::make_nccl(const Group& g, const char* name) {
  ncclUniqueId id;
  std::memset(&id, 0, sizeof(id));
  if (g.rank == 0) NCCL_CHECK(ncclGetUniqueId(&id));
  std::vector<MPI_Request> req(1);
  check_mpi(MPI_Ibcast(&id, sizeof(id), MPI_BYTE, 0, g.mpi, req.data()), "MPI_Ibcast of the NCCL unique id");
  op_name = strprintf("creating the NCCL communicator of the %s group", g.name);
  wait_requests(req, "the NCCL unique id from the group's first rank");
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // every call returns at once; waits poll ncclCommGetAsyncError against the timeout
  config.commName = name;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, g.size, id, g.rank, &config);
  if (comm) nccl_comms.push_back(comm);
  touch();
  nccl_settle(r, comm, strprintf("ncclCommInitRankConfig (%d ranks)", g.size));
  return comm;
}

ncclDataType_t Communicator::Impl::nccl_type(DataType t) const {
  switch (t) {
    case DataType::f32: return ncclFloat32;
    case DataType::bf16: return ncclBfloat16;
    case DataType::f16: return ncclFloat16;
    case DataType::i64: return ncclInt64;
    case DataType::i32: return ncclInt32;
    case DataType::u8: return ncclUint8;
  }
  return ncclUint8;
}
#endif

MPI_Datatype Communicator::Impl::mpi_type(DataType t) const {
  switch (t) {
    case DataType::f32: return MPI_FLOAT;
    case DataType::bf16: return MPI_UINT16_T;
    case DataType::f16: return MPI_UINT16_T;
    case DataType::i64: return MPI_INT64_T;
    case DataType::i32: return MPI_INT32_T;
    case DataType::u8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op Communicator::Impl::mpi_sum(DataType t) const {
  if (t == DataType::bf16) return op_sum_bf16;
  if (t == DataType::f16) return op_sum_f16;
  return MPI_SUM;
}

bool Communicator::Impl::staged(bool collective) const {
  if (stage_always) return true;
  if (!cuda) return false;
  // Device pointers go to MPI only for point-to-point transfers of a CUDA-aware library: non-blocking
  // collectives reduce and copy on the host in some libraries (Open MPI's libnbc), and user-defined
  // operations (bf16, fp16 sums) always run on the host.
  return collective || !cuda_aware;
}

// ---------------------------------------------------------------------------------------------------------
// Operation frame, waits and the failure path

void Communicator::Impl::begin_op(const char* name, size_t send_bytes, size_t recv_bytes,
                                  const std::string& peers) {
  op_name = name;
  op_detail = strprintf("this rank sends %zu bytes and receives %zu bytes; peers: %s", send_bytes, recv_bytes,
                        peers.c_str());
  pending.clear();
  events_used = 0;
  touch();
#if SPARTA_CUDA
  if (cuda) {
    // The communication and copy streams start after what the compute stream has queued (inputs ready,
    // outputs no longer read), without a host sync.
    CUDA_CHECK(cudaEventRecord(input_ev, dev.stream));
    CUDA_CHECK(cudaStreamWaitEvent(comm_stream, input_ev, 0));
    CUDA_CHECK(cudaStreamWaitEvent(copy_stream, input_ev, 0));
  }
#endif
}

void Communicator::Impl::end_op() {
  // cpu: the node group's MPI requests; cuda: pending work is on the communication stream, covered by done_ev.
  if (!cuda)
    for (Ready& r : pending) wait_ready(r, "the MPI calls of " + op_name + " in " + members(node_group));
  pending.clear();
#if SPARTA_CUDA
  if (cuda) CUDA_CHECK(cudaEventRecord(done_ev, comm_stream));
#endif
}

void Communicator::Impl::poll_health(const std::string& waiting_for) {
#if SPARTA_CUDA
  for (NcclComm c : nccl_comms) {
    ncclResult_t state = ncclSuccess;
    ncclResult_t r = ncclCommGetAsyncError(c, &state);
    if (r != ncclSuccess) fail(strprintf("ncclCommGetAsyncError returned %s", ncclGetErrorString(r)));
    if (state != ncclSuccess && state != ncclInProgress)
      fail(strprintf("NCCL reported %s (%s) while waiting for %s", ncclGetErrorString(state), ncclGetLastError(c),
                     waiting_for.c_str()));
  }
#endif
  double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - last_progress).count();
  if (idle > opt.timeout_s)
    fail(strprintf("no progress for %.1f s (timeout %g s) while waiting for %s", idle, opt.timeout_s,
                   waiting_for.c_str()));
  std::this_thread::yield();
}

void Communicator::Impl::fail(const std::string& why) {
  std::string msg = strprintf(
      "communication failed in %s (mode %s, %s backend) on rank %d of %d (node %d of %d, local rank %d of %d): "
      "%s. %s",
      op_name.c_str(), comm_mode_name(opt.mode), cuda ? "cuda" : "cpu", rank, size, node, num_nodes, local,
      local_size, why.c_str(), op_detail.c_str());
#if SPARTA_CUDA
  // Aborting stops NCCL kernels that wait for a peer that will never come, so the process can end.
  for (NcclComm c : nccl_comms) ncclCommAbort(c);
  nccl_comms.clear();
#endif
  SPARTA_FATAL("%s", msg.c_str());
}

void Communicator::Impl::check_mpi(int code, const std::string& what) {
  if (code == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(code, text, &len);
  fail(strprintf("MPI error %d (%.*s) in %s", code, len, text, what.c_str()));
}

bool Communicator::Impl::ready_done(Ready& r) {
#if SPARTA_CUDA
  if (r.event && !event_done(r.event)) return false;
#endif
  for (auto& reqs : r.reqs) {
    if (reqs->empty()) continue;
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs->size()), reqs->data(), &flag, MPI_STATUSES_IGNORE),
              "MPI requests of the node group's part of " + op_name);
    if (!flag) return false;
  }
  return true;
}

void Communicator::Impl::wait_ready(Ready& r, const std::string& what) {
  while (!ready_done(r)) poll_health(what);
  touch();
}

void Communicator::Impl::wait_requests(std::vector<MPI_Request>& reqs, const std::string& what) {
  for (;;) {
    int flag = 0;
    check_mpi(MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, MPI_STATUSES_IGNORE), what);
    if (flag) break;
    poll_health(what);
  }
  touch();
}

#if SPARTA_CUDA
bool Communicator::Impl::event_done(CudaEvent ev) {
  cudaError_t q = cudaEventQuery(ev);
  if (q == cudaSuccess) return true;
  if (q == cudaErrorNotReady) return false;
  cudaGetLastError();
  fail(strprintf("CUDA error %s (%s) on the communication stream", cudaGetErrorName(q), cudaGetErrorString(q)));
}

void Communicator::Impl::wait_event(CudaEvent ev, const std::string& what) {
  while (!event_done(ev)) poll_health(what);
  touch();
}

CudaEvent Communicator::Impl::record(Stream s) {
  if (events_used == event_pool.size()) {
    cudaEvent_t e;
    CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    event_pool.push_back(e);
  }
  CudaEvent e = event_pool[events_used++];
  CUDA_CHECK(cudaEventRecord(e, s));
  return e;
}

void Communicator::Impl::nccl_settle(ncclResult_t r, NcclComm comm, const std::string& what) {
  if (r == ncclSuccess) return;
  if (r != ncclInProgress)
    fail(strprintf("%s returned %s (%s)", what.c_str(), ncclGetErrorString(r), comm ? ncclGetLastError(comm) : ""));
  // Non-blocking communicator: the call goes on in the background; nothing may be queued until it is done.
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclCommGetAsyncError(comm, &state);
    if (state == ncclSuccess) break;
    if (state != ncclInProgress)
      fail(strprintf("%s failed: %s (%s)", what.c_str(), ncclGetErrorString(state), ncclGetLastError(comm)));
    poll_health(what);
  }
  touch();
}
#endif

void Communicator::Impl::copy(void* dst, const void* src, size_t bytes, Stream s) {
  if (bytes == 0 || dst == src) return;
  if (!cuda) {
    std::memmove(dst, src, bytes);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s));
#else
  (void)s;
#endif
}

void Communicator::Impl::copy_2d(void* dst, size_t dpitch, const void* src, size_t spitch, size_t width,
                                 size_t height, Stream s) {
  if (width == 0 || height == 0) return;
  if (!cuda) {
    for (size_t r = 0; r < height; ++r)
      std::memcpy(static_cast<char*>(dst) + r * dpitch, static_cast<const char*>(src) + r * spitch, width);
    return;
  }
#if SPARTA_CUDA
  CUDA_CHECK(cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, cudaMemcpyDefault, s));
#else
  (void)s;
#endif
}

char* Communicator::Impl::scratch_bytes(size_t bytes) {
  if (scratch.size() < bytes) {
    // The old buffer may still be read by queued work: freeing device memory waits for the device.
    scratch = Buffer<char>();
    scratch = Buffer<char>(dev, (bytes + (1u << 20) - 1) / (1u << 20) * (1u << 20));
  }
  return scratch.data();
}

// ---------------------------------------------------------------------------------------------------------
// The MPI pipeline

void Communicator::Impl::run_steps(std::vector<Step>& steps) {
  const size_t n = steps.size();
  if (n == 0) return;
  std::vector<size_t> off(n, 0);
  size_t total = 0;
  bool any_direct = false;
  for (size_t i = 0; i < n; ++i) {
    off[i] = total;
    total += (steps[i].stage_bytes + 255) / 256 * 256;
    if (steps[i].stage_bytes == 0 && steps[i].start) any_direct = true;
  }
  char* base = nullptr;
  if (total > 0) {
#if SPARTA_CUDA
    if (stage_busy) wait_event(stage_free_ev, "the host-to-device copies of the previous staged transfer");
#endif
    stage_busy = false;
    if (stage.bytes() < total) {
      stage = PinnedBuffer<char>();
      stage = PinnedBuffer<char>(dev.backend, total);
    }
    base = stage.data();
  }
  auto slice = [&](size_t i) { return steps[i].stage_bytes ? base + off[i] : nullptr; };
  (void)any_direct;

#if SPARTA_CUDA
  // MPI reads and writes device memory from the host: only once the compute stream's earlier work is done.
  if (cuda && any_direct) wait_event(input_ev, "the compute stream's work queued before this operation");
  std::vector<CudaEvent> in_done(n, nullptr);
#endif
  // Device→host copies of every staged step are queued at once; each MPI call starts when its copy is done.
  for (size_t i = 0; i < n; ++i) {
    Step& s = steps[i];
    if (!s.copy_in) continue;
#if SPARTA_CUDA
    if (cuda) {
      if (s.ready.event) CUDA_CHECK(cudaStreamWaitEvent(copy_stream, s.ready.event, 0));
      s.copy_in(slice(i));
      in_done[i] = record(copy_stream);
      continue;
    }
#endif
    wait_ready(s.ready, s.what);
    s.copy_in(slice(i));
  }

  // Steps start in order (collectives must start in the same order on every rank) and complete in order
  // (so `after` queues the next phase in the same order on every rank of a node).
  std::vector<MPI_Request> req(n, MPI_REQUEST_NULL);
  size_t next = 0, fin = 0;
  touch();
  while (fin < n) {
    bool moved = false;
    while (next < n) {
      Step& s = steps[next];
      bool ok;
#if SPARTA_CUDA
      if (cuda && s.copy_in) ok = event_done(in_done[next]);
      else
#endif
        ok = s.copy_in ? true : ready_done(s.ready);
      if (!ok) break;
      if (s.start) check_mpi(s.start(slice(next), &req[next]), s.what);
      ++next, moved = true;
    }
    while (fin < next) {
      int flag = 0;
      check_mpi(MPI_Test(&req[fin], &flag, MPI_STATUS_IGNORE), steps[fin].what);
      if (!flag) break;
      Step& s = steps[fin];
      if (s.copy_out) s.copy_out(slice(fin));
      if (s.after) s.after();
      ++fin, moved = true;
    }
    if (fin == n) break;
    if (moved) touch();
    else poll_health(steps[fin].what);
  }
#if SPARTA_CUDA
  if (cuda && total > 0) {
    CUDA_CHECK(cudaEventRecord(stage_free_ev, comm_stream));
    stage_busy = true;
  }
#endif
}

void Communicator::Impl::add_send(std::vector<Step>& steps, const Group& g, const char* src, size_t bytes, int peer,
                                  int tag, const Ready& ready, bool stg) {
  const size_t chunk = stg ? opt.chunk_bytes : kDirectChunk;
  MPI_Comm comm = g.mpi;
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = std::min(chunk, bytes - off);
    int n = static_cast<int>(len);
    const char* p = src + off;
    Step s;
    s.ready = ready;
    s.what = strprintf("MPI send of %zu bytes to rank %d (%s rank %d)", len, g.world_of[peer], g.name, peer);
    if (stg) {
      s.stage_bytes = len;
      s.copy_in = [this, p, len](char* st) { copy(st, p, len, copy_stream); };
      s.start = [=](char* st, MPI_Request* r) { return MPI_Isend(st, n, MPI_BYTE, peer, tag, comm, r); };
    } else {
      s.start = [=](char*, MPI_Request* r) { return MPI_Isend(p, n, MPI_BYTE, peer, tag, comm, r); };
    }
    steps.push_back(std::move(s));
  }
}

void Communicator::Impl::add_recv(std::vector<Step>& steps, const Group& g, char* dst, size_t bytes, int peer,
                                  int tag, bool stg) {
  const size_t chunk = stg ? opt.chunk_bytes : kDirectChunk;
  MPI_Comm comm = g.mpi;
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = std::min(chunk, bytes - off);
    int n = static_cast<int>(len);
    char* p = dst + off;
    Step s;
    s.what = strprintf("MPI receive of %zu bytes from rank %d (%s rank %d)", len, g.world_of[peer], g.name, peer);
    if (stg) {
      s.stage_bytes = len;
      s.start = [=](char* st, MPI_Request* r) { return MPI_Irecv(st, n, MPI_BYTE, peer, tag, comm, r); };
      s.copy_out = [this, p, len](char* st) { copy(p, st, len, comm_stream); };
    } else {
      s.start = [=](char*, MPI_Request* r) { return MPI_Irecv(p, n, MPI_BYTE, peer, tag, comm, r); };
    }
    steps.push_back(std::move(s));
  }
}

void Communicator::Impl::add_all_reduce(std::vector<Step>& steps, const Group& g, const char* send, char* recv,
                                        size_t count, DataType t, const Ready& ready, bool stg) {
  const size_t es = dtype_size(t);
  const size_t per = stg ? std::max<size_t>(1, opt.chunk_bytes / es) : kDirectChunk / es;
  MPI_Comm comm = g.mpi;
  MPI_Datatype dt = mpi_type(t);
  MPI_Op op = mpi_sum(t);
  for (size_t a = 0; a < count; a += per) {
    size_t c = std::min(per, count - a);
    int n = static_cast<int>(c);
    const char* sp = send + a * es;
    char* rp = recv + a * es;
    Step s;
    s.ready = ready;
    s.what = strprintf("MPI all-reduce of %zu bytes over %s", c * es, members(g).c_str());
    if (stg) {
      s.stage_bytes = c * es;
      s.copy_in = [this, sp, c, es](char* st) { copy(st, sp, c * es, copy_stream); };
      s.start = [=](char* st, MPI_Request* r) { return MPI_Iallreduce(MPI_IN_PLACE, st, n, dt, op, comm, r); };
      s.copy_out = [this, rp, c, es](char* st) { copy(rp, st, c * es, comm_stream); };
    } else {
      const void* in = send == recv ? MPI_IN_PLACE : static_cast<const void*>(sp);
      s.start = [=](char*, MPI_Request* r) { return MPI_Iallreduce(in, rp, n, dt, op, comm, r); };
    }
    steps.push_back(std::move(s));
  }
}

void Communicator::Impl::add_reduce_scatter(std::vector<Step>& steps, const Group& g, const char* send, char* recv,
                                            size_t rc, DataType t, const Ready& ready, bool stg) {
  if (rc == 0) return;
  const size_t es = dtype_size(t);
  const size_t W = g.size;
  MPI_Comm comm = g.mpi;
  MPI_Datatype dt = mpi_type(t);
  MPI_Op op = mpi_sum(t);
  if (!stg && rc * W <= static_cast<size_t>(INT_MAX)) {
    int n = static_cast<int>(rc);
    Step s;
    s.ready = ready;
    s.what = strprintf("MPI reduce-scatter of %zu bytes per rank over %s", rc * es, members(g).c_str());
    s.start = [=](char*, MPI_Request* r) { return MPI_Ireduce_scatter_block(send, recv, n, dt, op, comm, r); };
    steps.push_back(std::move(s));
    return;
  }
  // Staged (or too large for int counts): chunk k takes elements [a, a+c) of every rank's block, packed by a
  // strided copy into [W][c]; the result goes to a separate slot (in-place semantics differ between MPIs).
  const size_t per = std::max<size_t>(1, opt.chunk_bytes / (es * W));
  for (size_t a = 0; a < rc; a += per) {
    size_t c = std::min(per, rc - a);
    int n = static_cast<int>(c);
    const char* sp = send + a * es;
    char* rp = recv + a * es;
    Step s;
    s.ready = ready;
    s.what = strprintf("MPI reduce-scatter of %zu bytes per rank over %s", c * es, members(g).c_str());
    s.stage_bytes = (W + 1) * c * es;
    s.copy_in = [=](char* st) { copy_2d(st, c * es, sp, rc * es, c * es, W, copy_stream); };
    s.start = [=](char* st, MPI_Request* r) {
      return MPI_Ireduce_scatter_block(st, st + W * c * es, n, dt, op, comm, r);
    };
    s.copy_out = [=](char* st) { copy(rp, st + W * c * es, c * es, comm_stream); };
    steps.push_back(std::move(s));
  }
}

void Communicator::Impl::add_all_gather_v(std::vector<Step>& steps, const Group& g, const char* send, char* recv,
                                          const std::vector<size_t>& counts, DataType t, bool stg) {
  const size_t es = dtype_size(t);
  const int W = g.size, me = g.rank;
  auto d = std::make_shared<std::vector<size_t>>(prefix_sums(counts));
  const size_t total = (*d)[W - 1] + counts[W - 1];
  if (total == 0) return;
  char* own = recv + (*d)[me] * es;
  MPI_Comm comm = g.mpi;
  if (!stg && total * es <= static_cast<size_t>(INT_MAX)) {
    auto cnt = std::make_shared<std::vector<int>>(W), displ = std::make_shared<std::vector<int>>(W);
    for (int r = 0; r < W; ++r) (*cnt)[r] = static_cast<int>(counts[r] * es), (*displ)[r] = static_cast<int>((*d)[r] * es);
    const void* in = send == own ? MPI_IN_PLACE : static_cast<const void*>(send);
    int mine = (*cnt)[me];
    Step s;
    s.what = strprintf("MPI all-gather of %zu bytes over %s", total * es, members(g).c_str());
    s.start = [=](char*, MPI_Request* r) {
      return MPI_Iallgatherv(in, mine, MPI_BYTE, recv, cnt->data(), displ->data(), MPI_BYTE, comm, r);
    };
    steps.push_back(std::move(s));
    return;
  }
  // Staged: chunk k carries elements [a, a+c) of every rank's block in slots [W][c].
  copy(own, send, counts[me] * es, comm_stream);
  size_t maxc = *std::max_element(counts.begin(), counts.end());
  const size_t per = std::max<size_t>(1, opt.chunk_bytes / (es * W));
  for (size_t a = 0; a < maxc; a += per) {
    size_t c = std::min(per, maxc - a);
    auto piece = std::make_shared<std::vector<size_t>>(W);
    auto cnt = std::make_shared<std::vector<int>>(W), displ = std::make_shared<std::vector<int>>(W);
    for (int r = 0; r < W; ++r) {
      (*piece)[r] = counts[r] > a ? std::min(c, counts[r] - a) : 0;
      (*cnt)[r] = static_cast<int>((*piece)[r] * es);
      (*displ)[r] = static_cast<int>(r * c * es);
    }
    Step s;
    s.what = strprintf("MPI all-gather of %zu bytes per rank over %s", c * es, members(g).c_str());
    s.stage_bytes = W * c * es;
    const char* sp = send + a * es;
    s.copy_in = [=](char* st) { copy(st + me * c * es, sp, (*piece)[me] * es, copy_stream); };
    s.start = [=](char* st, MPI_Request* r) {
      return MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_DATATYPE_NULL, st, cnt->data(), displ->data(), MPI_BYTE, comm, r);
    };
    s.copy_out = [=](char* st) {
      for (int r = 0; r < W; ++r)
        if (r != me) copy(recv + ((*d)[r] + a) * es, st + r * c * es, (*piece)[r] * es, comm_stream);
    };
    steps.push_back(std::move(s));
  }
}

void Communicator::Impl::add_broadcast(std::vector<Step>& steps, const Group& g, char* buf, size_t bytes, int root,
                                       size_t chunk, bool stg) {
  MPI_Comm comm = g.mpi;
  const bool is_root = g.rank == root;
  for (size_t off = 0; off < bytes; off += chunk) {
    size_t len = std::min(chunk, bytes - off);
    int n = static_cast<int>(len);
    char* p = buf + off;
    Step s;
    s.what = strprintf("MPI broadcast of %zu bytes from rank %d over %s", len, g.world_of[root], members(g).c_str());
    if (stg) {
      s.stage_bytes = len;
      if (is_root) s.copy_in = [this, p, len](char* st) { copy(st, p, len, copy_stream); };
      else s.copy_out = [this, p, len](char* st) { copy(p, st, len, comm_stream); };
      s.start = [=](char* st, MPI_Request* r) { return MPI_Ibcast(st, n, MPI_BYTE, root, comm, r); };
    } else {
      s.start = [=](char*, MPI_Request* r) { return MPI_Ibcast(p, n, MPI_BYTE, root, comm, r); };
    }
    steps.push_back(std::move(s));
  }
}

// ---------------------------------------------------------------------------------------------------------
// One group's collectives: NCCL queued on the communication stream (cuda), or MPI posted on host buffers (cpu)

namespace {
void require_int(size_t n, const char* what) {
  SPARTA_ASSERT(n <= static_cast<size_t>(INT_MAX), "%s of %zu elements exceeds one MPI call's int count", what, n);
}
}  // namespace

Ready Communicator::Impl::group_p2p(const Group& g, const std::vector<P2p>& sends, const std::vector<P2p>& recvs,
                                    int tag) {
  Ready out;
#if SPARTA_CUDA
  if (cuda) {
    std::string what = strprintf("NCCL send/receive group in the %s group", g.name);
    nccl_settle(ncclGroupStart(), g.nccl, what);
    for (const P2p& s : sends)
      if (s.bytes) nccl_settle(ncclSend(s.ptr, s.bytes, ncclUint8, s.peer, g.nccl, comm_stream), g.nccl, what);
    for (const P2p& r : recvs)
      if (r.bytes) nccl_settle(ncclRecv(r.ptr, r.bytes, ncclUint8, r.peer, g.nccl, comm_stream), g.nccl, what);
    nccl_settle(ncclGroupEnd(), g.nccl, what);
    out.event = record(comm_stream);
    return out;
  }
#endif
  auto reqs = std::make_shared<std::vector<MPI_Request>>();
  auto post = [&](const P2p& x, bool is_send) {
    for (size_t off = 0; off < x.bytes; off += kDirectChunk) {
      int n = static_cast<int>(std::min(kDirectChunk, x.bytes - off));
      reqs->push_back(MPI_REQUEST_NULL);
      int rc = is_send ? MPI_Isend(x.ptr + off, n, MPI_BYTE, x.peer, kTag + tag, g.mpi, &reqs->back())
                       : MPI_Irecv(x.ptr + off, n, MPI_BYTE, x.peer, kTag + tag, g.mpi, &reqs->back());
      check_mpi(rc, strprintf("MPI %s of %d bytes %s rank %d (%s rank %d)", is_send ? "send" : "receive", n,
                              is_send ? "to" : "from", g.world_of[x.peer], g.name, x.peer));
    }
  };
  for (const P2p& r : recvs) post(r, false);
  for (const P2p& s : sends) post(s, true);
  out.reqs.push_back(reqs);
  return out;
}

Ready Communicator::Impl::group_reduce_scatter(const Group& g, const char* send, char* recv, size_t count,
                                               DataType t) {
  Ready out;
  if (count == 0) return out;
#if SPARTA_CUDA
  if (cuda) {
    nccl_settle(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, g.nccl, comm_stream), g.nccl,
                strprintf("ncclReduceScatter of %zu elements per rank in the %s group", count, g.name));
    out.event = record(comm_stream);
    return out;
  }
#endif
  require_int(count * g.size, "reduce-scatter inside the node");
  auto reqs = std::make_shared<std::vector<MPI_Request>>(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Ireduce_scatter_block(send, recv, static_cast<int>(count), mpi_type(t), mpi_sum(t), g.mpi,
                                      reqs->data()),
            strprintf("MPI reduce-scatter in the %s group", g.name));
  out.reqs.push_back(reqs);
  return out;
}

Ready Communicator::Impl::group_all_gather(const Group& g, const char* send, char* recv, size_t count, DataType t) {
  Ready out;
  if (count == 0) return out;
#if SPARTA_CUDA
  if (cuda) {
    nccl_settle(ncclAllGather(send, recv, count, nccl_type(t), g.nccl, comm_stream), g.nccl,
                strprintf("ncclAllGather of %zu elements per rank in the %s group", count, g.name));
    out.event = record(comm_stream);
    return out;
  }
#endif
  const size_t bytes = count * dtype_size(t);
  require_int(bytes * g.size, "all-gather inside the node");
  const void* in = send == recv + g.rank * bytes ? MPI_IN_PLACE : static_cast<const void*>(send);
  auto reqs = std::make_shared<std::vector<MPI_Request>>(1, MPI_REQUEST_NULL);
  int n = static_cast<int>(bytes);
  check_mpi(MPI_Iallgather(in, n, MPI_BYTE, recv, n, MPI_BYTE, g.mpi, reqs->data()),
            strprintf("MPI all-gather in the %s group", g.name));
  out.reqs.push_back(reqs);
  return out;
}

Ready Communicator::Impl::group_all_reduce(const Group& g, const char* send, char* recv, size_t count, DataType t) {
  Ready out;
  if (count == 0) return out;
#if SPARTA_CUDA
  if (cuda) {
    nccl_settle(ncclAllReduce(send, recv, count, nccl_type(t), ncclSum, g.nccl, comm_stream), g.nccl,
                strprintf("ncclAllReduce of %zu elements in the %s group", count, g.name));
    out.event = record(comm_stream);
    return out;
  }
#endif
  require_int(count, "all-reduce inside the node");
  const void* in = send == recv ? MPI_IN_PLACE : static_cast<const void*>(send);
  auto reqs = std::make_shared<std::vector<MPI_Request>>(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Iallreduce(in, recv, static_cast<int>(count), mpi_type(t), mpi_sum(t), g.mpi, reqs->data()),
            strprintf("MPI all-reduce in the %s group", g.name));
  out.reqs.push_back(reqs);
  return out;
}

Ready Communicator::Impl::group_broadcast(const Group& g, char* buf, size_t bytes, int root) {
  Ready out;
  if (bytes == 0) return out;
#if SPARTA_CUDA
  if (cuda) {
    nccl_settle(ncclBroadcast(buf, buf, bytes, ncclUint8, root, g.nccl, comm_stream), g.nccl,
                strprintf("ncclBroadcast of %zu bytes in the %s group", bytes, g.name));
    out.event = record(comm_stream);
    return out;
  }
#endif
  require_int(bytes, "broadcast inside the node");
  auto reqs = std::make_shared<std::vector<MPI_Request>>(1, MPI_REQUEST_NULL);
  check_mpi(MPI_Ibcast(buf, static_cast<int>(bytes), MPI_BYTE, root, g.mpi, reqs->data()),
            strprintf("MPI broadcast in the %s group", g.name));
  out.reqs.push_back(reqs);
  return out;
}

// ---------------------------------------------------------------------------------------------------------
// Flat algorithms over one group (group rank order = the order of counts and blocks)

void Communicator::Impl::flat_all_to_all_v(const Group& g, bool use_nccl, const char* send,
                                           const std::vector<size_t>& scount, char* recv,
                                           const std::vector<size_t>& rcount, DataType t) {
  const size_t es = dtype_size(t);
  const int W = g.size, me = g.rank;
  std::vector<size_t> sd = prefix_sums(scount), rd = prefix_sums(rcount);
  if (scount[me] != rcount[me])
    fail(strprintf("this rank sends %zu elements to itself but expects %zu from itself", scount[me], rcount[me]));
  if (use_nccl) {
    // This rank's own block goes in the group too: NCCL copies it while the peers' blocks travel.
    std::vector<P2p> sends, recvs;
    for (int k = 0; k < W; ++k) {
      int to = (me + k) % W, from = (me - k + W) % W;
      sends.push_back({const_cast<char*>(send) + sd[to] * es, scount[to] * es, to});
      recvs.push_back({recv + rd[from] * es, rcount[from] * es, from});
    }
    group_p2p(g, sends, recvs, 0);
    return;
  }
  copy(recv + rd[me] * es, send + sd[me] * es, scount[me] * es, comm_stream);
  const bool stg = staged(false);
  std::vector<Step> steps;
  for (int k = 1; k < W; ++k) {
    int from = (me - k + W) % W;
    add_recv(steps, g, recv + rd[from] * es, rcount[from] * es, from, kTag, stg);
  }
  for (int k = 1; k < W; ++k) {
    int to = (me + k) % W;
    add_send(steps, g, send + sd[to] * es, scount[to] * es, to, kTag, Ready(), stg);
  }
  run_steps(steps);
}

void Communicator::Impl::flat_all_reduce(const Group& g, bool use_nccl, const char* send, char* recv, size_t count,
                                         DataType t) {
  if (use_nccl) {
    group_all_reduce(g, send, recv, count, t);
    return;
  }
  std::vector<Step> steps;
  add_all_reduce(steps, g, send, recv, count, t, Ready(), staged(true));
  run_steps(steps);
}

void Communicator::Impl::flat_reduce_scatter(const Group& g, bool use_nccl, const char* send, char* recv, size_t rc,
                                             DataType t) {
  if (use_nccl) {
    group_reduce_scatter(g, send, recv, rc, t);
    return;
  }
  std::vector<Step> steps;
  add_reduce_scatter(steps, g, send, recv, rc, t, Ready(), staged(true));
  run_steps(steps);
}

void Communicator::Impl::flat_all_gather_v(const Group& g, bool use_nccl, const char* send, char* recv,
                                           const std::vector<size_t>& counts, DataType t) {
  const size_t es = dtype_size(t);
  const int W = g.size, me = g.rank;
  if (use_nccl) {
    bool equal = std::all_of(counts.begin(), counts.end(), [&](size_t c) { return c == counts[0]; });
    if (equal) {
      group_all_gather(g, send, recv, counts[0], t);
      return;
    }
    std::vector<size_t> d = prefix_sums(counts);
    copy(recv + d[me] * es, send, counts[me] * es, comm_stream);
    std::vector<P2p> sends, recvs;
    for (int k = 1; k < W; ++k) {
      int to = (me + k) % W, from = (me - k + W) % W;
      sends.push_back({const_cast<char*>(send), counts[me] * es, to});
      recvs.push_back({recv + d[from] * es, counts[from] * es, from});
    }
    group_p2p(g, sends, recvs, 0);
    return;
  }
  std::vector<Step> steps;
  add_all_gather_v(steps, g, send, recv, counts, t, staged(true));
  run_steps(steps);
}

void Communicator::Impl::flat_broadcast(const Group& g, bool use_nccl, char* buf, size_t bytes, int root) {
  if (use_nccl) {
    group_broadcast(g, buf, bytes, root);
    return;
  }
  const bool stg = staged(true);
  std::vector<Step> steps;
  add_broadcast(steps, g, buf, bytes, root, stg ? opt.chunk_bytes : kDirectChunk, stg);
  run_steps(steps);
}

// ---------------------------------------------------------------------------------------------------------
// Public operations

Communicator::Communicator(const Topology& topo, const Device& dev, const CommOptions& opt)
    : impl_(std::make_unique<Impl>(topo, dev, opt)) {}

Communicator::~Communicator() = default;

CommMode Communicator::mode() const { return impl_->opt.mode; }
int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }
bool Communicator::cuda_aware_mpi() const { return impl_->cuda_aware; }

std::string Communicator::describe() const {
  const Impl& m = *impl_;
  return strprintf("communicator: mode %s, %s backend, %d node(s) x %d rank(s)%s, MPI CUDA-aware: %s, staging %s "
                   "(chunks of %s), timeout %g s",
                   comm_mode_name(m.opt.mode), m.cuda ? "cuda" : "cpu", m.num_nodes, m.local_size,
                   m.uniform ? "" : " (not uniform)", m.cuda_aware ? "yes" : "no", m.opt.staging.c_str(),
                   mib(m.opt.chunk_bytes).c_str(), m.opt.timeout_s);
}

namespace {
std::string all_ranks(int size) { return strprintf("all %d ranks", size); }

size_t total(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t(0)); }
}  // namespace

std::vector<size_t> Communicator::exchange_counts(const std::vector<size_t>& send_counts) {
  Impl& m = *impl_;
  m.op_name = "exchange_counts";
  m.op_detail = strprintf("this rank sends %d counts; peers: %s", m.size, all_ranks(m.size).c_str());
  m.touch();
  if (static_cast<int>(send_counts.size()) != m.size)
    m.fail(strprintf("send_counts holds %zu entries, expected one per rank (%d)", send_counts.size(), m.size));
  std::vector<uint64_t> out(send_counts.begin(), send_counts.end()), in(m.size);
  std::vector<MPI_Request> req(1);
  m.check_mpi(MPI_Ialltoall(out.data(), 1, MPI_UINT64_T, in.data(), 1, MPI_UINT64_T, m.world.mpi, req.data()),
              "MPI_Ialltoall of the counts");
  m.wait_requests(req, "the counts of every rank (MPI all-to-all)");
  return std::vector<size_t>(in.begin(), in.end());
}

void Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                const std::vector<size_t>& recv_counts, DataType type) {
  Impl& m = *impl_;
  const size_t es = dtype_size(type);
  m.begin_op("all_to_all_v", total(send_counts) * es, total(recv_counts) * es, all_ranks(m.size));
  if (static_cast<int>(send_counts.size()) != m.size || static_cast<int>(recv_counts.size()) != m.size)
    m.fail(strprintf("send_counts and recv_counts hold %zu and %zu entries, expected one per rank (%d)",
                     send_counts.size(), recv_counts.size(), m.size));
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_to_all_v(m.world, true, s, send_counts, r, recv_counts, type); break;
    case CommMode::mpi: m.flat_all_to_all_v(m.world, false, s, send_counts, r, recv_counts, type); break;
    case CommMode::hier: m.hier_all_to_all_v(s, send_counts, r, recv_counts, type, false); break;
  }
  m.end_op();
}

std::vector<size_t> Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                               size_t recv_capacity, DataType type) {
  std::vector<size_t> recv_counts = exchange_counts(send_counts);
  size_t n = total(recv_counts);
  if (n > recv_capacity) {
    std::string list;
    for (size_t c : recv_counts) list += (list.empty() ? "" : ",") + std::to_string(c);
    impl_->op_name = "all_to_all_v";
    impl_->fail(strprintf("the ranks send this rank %zu elements (%s), but its receive buffer holds %zu", n,
                          list.c_str(), recv_capacity));
  }
  all_to_all_v(send, send_counts, recv, recv_counts, type);
  return recv_counts;
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, DataType type) {
  Impl& m = *impl_;
  const size_t bytes = count * dtype_size(type) * m.size;
  m.begin_op("all_to_all", bytes, bytes, all_ranks(m.size));
  std::vector<size_t> counts(m.size, count);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_to_all_v(m.world, true, s, counts, r, counts, type); break;
    case CommMode::mpi: m.flat_all_to_all_v(m.world, false, s, counts, r, counts, type); break;
    case CommMode::hier: m.hier_all_to_all_v(s, counts, r, counts, type, true); break;
  }
  m.end_op();
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type) {
  Impl& m = *impl_;
  const size_t bytes = recv_count * dtype_size(type);
  m.begin_op("reduce_scatter", bytes * m.size, bytes, all_ranks(m.size));
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_reduce_scatter(m.world, true, s, r, recv_count, type); break;
    case CommMode::mpi: m.flat_reduce_scatter(m.world, false, s, r, recv_count, type); break;
    case CommMode::hier: m.hier_reduce_scatter(s, r, recv_count, type); break;
  }
  m.end_op();
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, DataType type) {
  Impl& m = *impl_;
  const size_t bytes = count * dtype_size(type);
  m.begin_op("all_reduce", bytes, bytes, all_ranks(m.size));
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_reduce(m.world, true, s, r, count, type); break;
    case CommMode::mpi: m.flat_all_reduce(m.world, false, s, r, count, type); break;
    case CommMode::hier: m.hier_all_reduce(s, r, count, type); break;
  }
  m.end_op();
}

void Communicator::all_gather(const void* send, void* recv, size_t count, DataType type) {
  all_gather_v(send, recv, std::vector<size_t>(impl_->size, count), type);
}

void Communicator::all_gather_v(const void* send, void* recv, const std::vector<size_t>& counts, DataType type) {
  Impl& m = *impl_;
  const size_t es = dtype_size(type);
  if (static_cast<int>(counts.size()) != m.size) {
    m.op_name = "all_gather_v";
    m.fail(strprintf("counts holds %zu entries, expected one per rank (%d)", counts.size(), m.size));
  }
  m.begin_op("all_gather", counts[m.rank] * es * (m.size - 1), total(counts) * es, all_ranks(m.size));
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_gather_v(m.world, true, s, r, counts, type); break;
    case CommMode::mpi: m.flat_all_gather_v(m.world, false, s, r, counts, type); break;
    case CommMode::hier: m.hier_all_gather_v(s, r, counts, type); break;
  }
  m.end_op();
}

void Communicator::broadcast(void* buf, size_t count, DataType type, int root) {
  Impl& m = *impl_;
  const size_t bytes = count * dtype_size(type);
  m.begin_op("broadcast", m.rank == root ? bytes : 0, m.rank == root ? 0 : bytes,
             strprintf("all %d ranks, root %d", m.size, root));
  if (root < 0 || root >= m.size) m.fail(strprintf("root %d is not a rank (0 to %d)", root, m.size - 1));
  char* b = static_cast<char*>(buf);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_broadcast(m.world, true, b, bytes, root); break;
    case CommMode::mpi: m.flat_broadcast(m.world, false, b, bytes, root); break;
    case CommMode::hier: m.hier_broadcast(b, bytes, root); break;
  }
  m.end_op();
}

void Communicator::barrier() {
  Impl& m = *impl_;
  m.op_name = "barrier";
  m.op_detail = strprintf("peers: %s", all_ranks(m.size).c_str());
  m.touch();
  std::vector<MPI_Request> req(1);
  m.check_mpi(MPI_Ibarrier(m.world.mpi, req.data()), "MPI_Ibarrier");
  m.wait_requests(req, "every rank to reach the barrier");
}

void Communicator::join() {
#if SPARTA_CUDA
  Impl& m = *impl_;
  if (m.cuda) CUDA_CHECK(cudaStreamWaitEvent(m.dev.stream, m.done_ev, 0));
#endif
}

void Communicator::synchronize() {
#if SPARTA_CUDA
  Impl& m = *impl_;
  if (!m.cuda) return;
  std::string last = m.op_name;
  m.op_name = "synchronize (after " + last + ")";
  m.touch();
  const Group& g = m.opt.mode == CommMode::nccl ? m.world : m.node_group;
  m.wait_event(m.done_ev, "the operations queued on the communication stream (NCCL in " + members(g) + ")");
  m.op_name = last;
#endif
}

}  // namespace sparta
