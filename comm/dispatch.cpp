// dispatch.cpp: the public operations of communicator.h: checks of their arguments, the operation frame
// (begin_op/end_op: the stream contract), and the choice of algorithm by mode: flat NCCL, flat MPI, or
// hierarchical. Also the flat dispatchers the hierarchical algorithms use for their degenerate layouts.
#include "comm/comm_impl.h"

#include <numeric>

namespace sparta {

// ---------------------------------------------------------------------------------------------------------
// Flat over one group: NCCL when use_nccl, else MPI

void Communicator::Impl::flat_all_to_all_v(const Group& g, bool use_nccl, const char* send,
                                           const std::vector<size_t>& scount, char* recv,
                                           const std::vector<size_t>& rcount, DataType t) {
  const int me = g.rank;
  if (scount[me] != rcount[me])
    fail(strprintf("this rank sends %zu elements to itself but expects %zu from itself", scount[me], rcount[me]));
  if (use_nccl) nccl_all_to_all_v(g, send, scount, recv, rcount, t);
  else mpi_all_to_all_v(g, send, scount, recv, rcount, t);
}

void Communicator::Impl::flat_all_reduce(const Group& g, bool use_nccl, const char* send, char* recv, size_t count,
                                         DataType t) {
  if (use_nccl) group_all_reduce(g, send, recv, count, t);
  else mpi_all_reduce(g, send, recv, count, t);
}

void Communicator::Impl::flat_reduce_scatter(const Group& g, bool use_nccl, const char* send, char* recv, size_t rc,
                                             DataType t) {
  if (use_nccl) group_reduce_scatter(g, send, recv, rc, t);
  else mpi_reduce_scatter(g, send, recv, rc, t);
}

void Communicator::Impl::flat_all_gather_v(const Group& g, bool use_nccl, const char* send, char* recv,
                                           const std::vector<size_t>& counts, DataType t) {
  if (use_nccl) nccl_all_gather_v(g, send, recv, counts, t);
  else mpi_all_gather_v(g, send, recv, counts, t);
}

void Communicator::Impl::flat_broadcast(const Group& g, bool use_nccl, char* buf, size_t bytes, int root) {
  if (use_nccl) group_broadcast(g, buf, bytes, root);
  else mpi_broadcast(g, buf, bytes, root);
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
                   "(chunks of %.3g MiB), timeout %g s%s%s%s",
                   comm_mode_name(m.opt.mode), m.cuda ? "cuda" : "cpu", m.num_nodes, m.local_size,
                   m.uniform ? "" : " (not uniform)", m.cuda_aware ? "yes" : "no", m.opt.staging.c_str(),
                   m.opt.chunk_bytes / 1048576.0, m.opt.timeout_s,
                   m.nccl_comms.empty() ? "" : (m.opt.nccl_blocking ? ", NCCL blocking" : ", NCCL non-blocking"),
                   m.nccl_comms.empty() ? "" : (m.opt.eager_connect ? ", eager connections" : ", lazy connections"),
                   m.check ? ", calls checked" : "");
}

namespace {
size_t total(const std::vector<size_t>& v) { return std::accumulate(v.begin(), v.end(), size_t(0)); }
}  // namespace

std::vector<size_t> Communicator::exchange_counts(const std::vector<size_t>& send_counts) {
  Impl& m = *impl_;
  m.op_name = "exchange_counts";
  m.op_framed = false;
  m.op_detail = strprintf("this rank sends %d counts; peers: all %d ranks", m.size, m.size);
  m.touch();
  if (static_cast<int>(send_counts.size()) != m.size)
    m.fail_args("exchange_counts", strprintf("send_counts holds %zu entries, expected one per rank (%d)",
                                             send_counts.size(), m.size));
  m.check_call("exchange_counts", -1, 0);
  std::vector<uint64_t> out(send_counts.begin(), send_counts.end()), in(m.size);
  std::vector<MPI_Request> req(1);
  m.check_mpi(MPI_Ialltoall(out.data(), 1, MPI_UINT64_T, in.data(), 1, MPI_UINT64_T, m.world.mpi, req.data()),
              "MPI_Ialltoall of the counts");
  m.wait_requests(req, "the counts of every rank (MPI all-to-all)");
  return std::vector<size_t>(in.begin(), in.end());
}

void Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                const std::vector<size_t>& recv_counts, DataType type, Stream stream) {
  Impl& m = *impl_;
  const size_t es = dtype_size(type);
  if (static_cast<int>(send_counts.size()) != m.size || static_cast<int>(recv_counts.size()) != m.size) {
    m.fail_args("all_to_all_v",
                strprintf("send_counts and recv_counts hold %zu and %zu entries, expected one per rank (%d)",
                          send_counts.size(), recv_counts.size(), m.size));
  }
  m.check_call("all_to_all_v", int(type), 0);
  m.check_counts(send_counts, recv_counts);
  m.begin_op("all_to_all_v", stream, total(send_counts) * es, total(recv_counts) * es);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_to_all_v(m.world, true, s, send_counts, r, recv_counts, type); break;
    case CommMode::mpi: m.flat_all_to_all_v(m.world, false, s, send_counts, r, recv_counts, type); break;
    case CommMode::hier: m.hier_all_to_all_v(s, send_counts, r, recv_counts, type, false); break;
  }
  m.end_op(stream);
}

std::vector<size_t> Communicator::all_to_all_v(const void* send, const std::vector<size_t>& send_counts, void* recv,
                                               size_t recv_capacity, DataType type, Stream stream) {
  std::vector<size_t> recv_counts = exchange_counts(send_counts);
  size_t n = total(recv_counts);
  if (n > recv_capacity) {
    std::string list;
    for (size_t c : recv_counts) list += (list.empty() ? "" : ",") + std::to_string(c);
    impl_->fail_args("all_to_all_v",
                     strprintf("the ranks send this rank %zu elements (%s), but its receive buffer holds %zu", n,
                               list.c_str(), recv_capacity));
  }
  all_to_all_v(send, send_counts, recv, recv_counts, type, stream);
  return recv_counts;
}

void Communicator::all_to_all(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  Impl& m = *impl_;
  const size_t bytes = count * dtype_size(type) * m.size;
  m.check_call("all_to_all", int(type), count);
  m.begin_op("all_to_all", stream, bytes, bytes);
  std::vector<size_t> counts(m.size, count);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_to_all_v(m.world, true, s, counts, r, counts, type); break;
    case CommMode::mpi: m.flat_all_to_all_v(m.world, false, s, counts, r, counts, type); break;
    case CommMode::hier: m.hier_all_to_all_v(s, counts, r, counts, type, true); break;
  }
  m.end_op(stream);
}

void Communicator::reduce_scatter(const void* send, void* recv, size_t recv_count, DataType type, Stream stream) {
  Impl& m = *impl_;
  const size_t bytes = recv_count * dtype_size(type);
  m.check_call("reduce_scatter", int(type), recv_count);
  m.begin_op("reduce_scatter", stream, bytes * m.size, bytes);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_reduce_scatter(m.world, true, s, r, recv_count, type); break;
    case CommMode::mpi: m.flat_reduce_scatter(m.world, false, s, r, recv_count, type); break;
    case CommMode::hier: m.hier_reduce_scatter(s, r, recv_count, type); break;
  }
  m.end_op(stream);
}

void Communicator::all_reduce(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  Impl& m = *impl_;
  const size_t bytes = count * dtype_size(type);
  m.check_call("all_reduce", int(type), count);
  m.begin_op("all_reduce", stream, bytes, bytes);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_reduce(m.world, true, s, r, count, type); break;
    case CommMode::mpi: m.flat_all_reduce(m.world, false, s, r, count, type); break;
    case CommMode::hier: m.hier_all_reduce(s, r, count, type); break;
  }
  m.end_op(stream);
}

void Communicator::all_gather(const void* send, void* recv, size_t count, DataType type, Stream stream) {
  all_gather_v(send, recv, std::vector<size_t>(impl_->size, count), type, stream);
}

void Communicator::all_gather_v(const void* send, void* recv, const std::vector<size_t>& counts, DataType type,
                                Stream stream) {
  Impl& m = *impl_;
  const size_t es = dtype_size(type);
  if (static_cast<int>(counts.size()) != m.size) {
    m.fail_args("all_gather_v",
                strprintf("counts holds %zu entries, expected one per rank (%d)", counts.size(), m.size));
  }
  m.check_call("all_gather_v", int(type), 0, &counts);
  m.begin_op("all_gather", stream, counts[m.rank] * es * (m.size - 1), total(counts) * es);
  const char* s = static_cast<const char*>(send);
  char* r = static_cast<char*>(recv);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_all_gather_v(m.world, true, s, r, counts, type); break;
    case CommMode::mpi: m.flat_all_gather_v(m.world, false, s, r, counts, type); break;
    case CommMode::hier: m.hier_all_gather_v(s, r, counts, type); break;
  }
  m.end_op(stream);
}

void Communicator::broadcast(void* buf, size_t count, DataType type, int root, Stream stream) {
  Impl& m = *impl_;
  const size_t bytes = count * dtype_size(type);
  if (root < 0 || root >= m.size) {
    m.fail_args("broadcast", strprintf("root %d is not a rank (0 to %d)", root, m.size - 1));
  }
  m.check_call("broadcast", int(type), count, nullptr, root);
  m.begin_op("broadcast", stream, m.rank == root ? bytes : 0, m.rank == root ? 0 : bytes, root);
  char* b = static_cast<char*>(buf);
  switch (m.opt.mode) {
    case CommMode::nccl: m.flat_broadcast(m.world, true, b, bytes, root); break;
    case CommMode::mpi: m.flat_broadcast(m.world, false, b, bytes, root); break;
    case CommMode::hier: m.hier_broadcast(b, bytes, root); break;
  }
  m.end_op(stream);
}

void Communicator::barrier() {
  Impl& m = *impl_;
  m.op_name = "barrier";
  m.op_framed = false;
  m.op_detail = strprintf("peers: all %d ranks", m.size);
  m.touch();
  m.check_call("barrier", -1, 0);
  std::vector<MPI_Request> req(1);
  m.check_mpi(MPI_Ibarrier(m.world.mpi, req.data()), "MPI_Ibarrier");
  m.wait_requests(req, "every rank to reach the barrier");
}

void Communicator::synchronize(Stream stream) {
#if SPARTA_CUDA
  Impl& m = *impl_;
  if (!m.cuda) return;
  std::string last = m.op_name;
  m.op_name = "synchronize (after " + last + ")";
  m.touch();
  const Group& g = m.opt.mode == CommMode::nccl ? m.world : m.node_group;
  CUDA_CHECK(cudaEventRecord(m.sync_ev, stream));
  m.wait_event(m.sync_ev, "the work queued on the caller's stream (NCCL in " + members(g) + ")");
  m.op_name = last;
#else
  (void)stream;
#endif
}

}  // namespace sparta
