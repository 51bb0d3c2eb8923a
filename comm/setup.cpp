// setup.cpp: building and tearing down a communicator: the MPI groups (world, node, cross) and what every
// rank must agree on, the NCCL communicators (unique id broadcast over MPI, connected at once), the communication
// and copy streams and their events; and the mapping of element types to NCCL and MPI.
#include "comm/comm_impl.h"

#if __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // Open MPI: MPIX_Query_cuda_support
#endif

#include <cstdlib>
#include <cstring>

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

}  // namespace

Communicator::Impl::Impl(const Topology& topo, const Device& d, const CommOptions& o) : opt(o), dev(d) {
  cuda = dev.is_cuda();
  rank = topo.rank, size = topo.size, node = topo.node, num_nodes = topo.num_nodes;
  local = topo.local_rank, local_size = topo.local_size, uniform = topo.uniform;
  touch();

  // What every rank must agree on is gathered first, so that a bad set-up throws the same error everywhere.
  const char* env_check = std::getenv("SPARTA_COMM_CHECK");
  const int check_me = opt.check_calls || (env_check && std::string(env_check) == "1");
  int lo[2] = {cuda ? 1 : 0, local_size}, hi[3] = {cuda ? 1 : 0, local_size, check_me};
  timed_allreduce(MPI_IN_PLACE, lo, 2, MPI_INT, MPI_MIN, topo.world, "communicator set-up (backends)");
  timed_allreduce(MPI_IN_PLACE, hi, 3, MPI_INT, MPI_MAX, topo.world, "communicator set-up (backends)");
  check = hi[2] != 0;
  SPARTA_REQUIRE(opt.timeout_s > 0, "communicator timeout: expected seconds > 0, found %g", opt.timeout_s);
  set_job_timeout(opt.timeout_s);  // one timeout for the job: the host-side waits (deadline.h) use it too
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
    for (CudaEvent* e : {&input_ev, &done_ev, &stage_free_ev, &sync_ev})
      CUDA_CHECK(cudaEventCreateWithFlags(e, cudaEventDisableTiming));
    if (opt.eager_connect) setenv("NCCL_RUNTIME_CONNECT", "0", 0);  // keeps a value the environment sets
    if (opt.mode == CommMode::nccl) world.nccl = make_nccl(world, "sparta-world");
    if (opt.mode == CommMode::hier && local_size > 1) node_group.nccl = make_nccl(node_group, "sparta-node");
    if (opt.eager_connect) {
      if (world.nccl) connect_peers(world);
      if (node_group.nccl) connect_peers(node_group);
    }
  }
#endif
  op_name = "the first operation";
}

Communicator::Impl::~Impl() {
#if SPARTA_CUDA
  if (cuda) {
    op_name = "shutdown";
    touch();
    // Every operation's device work ends on the communication stream (copy-stream work is waited for within
    // the operation), so done_ev covers all of it: after it, the streams, the scratch and the staging buffer
    // (freed after this body) are no longer used.
    wait_event(done_ev, "operations still queued on the communication stream");
    if (!nccl_comms.empty()) {
      // Every rank is here, done with its work and alive, before NCCL tears down what peers may still touch: a
      // blocking communicator's finalize is not under the timeout, this barrier is.
      std::vector<MPI_Request> req(1);
      check_mpi(MPI_Ibarrier(world.mpi, req.data()), "MPI_Ibarrier before the NCCL communicators' finalize");
      wait_requests(req, "every rank to reach the communicator's shutdown");
    }
    for (NcclComm c : nccl_comms) {
      touch();
      nccl_settle(ncclCommFinalize(c), c, [] { return std::string("ncclCommFinalize"); });
      ncclCommDestroy(c);
    }
    nccl_comms.clear();
    for (CudaEvent e : event_pool) cudaEventDestroy(e);
    for (CudaEvent e : {input_ev, done_ev, stage_free_ev, sync_ev}) cudaEventDestroy(e);
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
  // blocking (the default): calls launch in this thread; non-blocking: every call returns at once and the waits
  // poll ncclCommGetAsyncError against the timeout (CommOptions::nccl_blocking)
  config.blocking = opt.nccl_blocking ? 1 : 0;
  config.commName = name;
  ncclComm_t comm = nullptr;
  ncclResult_t r = ncclCommInitRankConfig(&comm, g.size, id, g.rank, &config);
  if (comm) nccl_comms.push_back(comm);
  touch();
  nccl_settle(r, comm, [&] { return strprintf("ncclCommInitRankConfig (%d ranks)", g.size); });
  return comm;
}

void Communicator::Impl::connect_peers(const Group& g) {
  // One byte to and from every member (this rank too): NCCL connects all of a peer's point-to-point channels on
  // the first transfer with it, whatever its size.
  op_name = strprintf("connecting to every peer of the %s group", g.name);
  Buffer<char> bytes(dev, 2 * size_t(g.size));
  CUDA_CHECK(cudaMemsetAsync(bytes.data(), 0, bytes.bytes(), comm_stream));
  std::vector<P2p> sends, recvs;
  for (int p = 0; p < g.size; ++p) {
    sends.push_back({bytes.data() + p, 1, p});
    recvs.push_back({bytes.data() + g.size + p, 1, p});
  }
  group_p2p(g, sends, recvs, 0);
  CUDA_CHECK(cudaEventRecord(done_ev, comm_stream));
  wait_event(done_ev, "the first exchange with every peer of " + members(g));
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

}  // namespace sparta
