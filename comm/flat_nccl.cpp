// flat_nccl.cpp: one group's collectives and the flat NCCL algorithms. On the cuda backend a group's
// collective is NCCL queued on the communication stream (its Ready is an event recorded after it); on the
// cpu backend it is the same collective posted as non-blocking MPI on host buffers (its Ready is the
// requests), which stands in for NCCL inside a node in mode hier.
#include "comm/comm_impl.h"

#include <algorithm>
#include <climits>

namespace sparta {

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
    auto what = [&] { return "NCCL send/receive group in " + members(g); };
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
    nccl_settle(ncclReduceScatter(send, recv, count, nccl_type(t), ncclSum, g.nccl, comm_stream), g.nccl, [&] {
      return strprintf("ncclReduceScatter of %zu elements per rank in %s", count, members(g).c_str());
    });
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
    nccl_settle(ncclAllGather(send, recv, count, nccl_type(t), g.nccl, comm_stream), g.nccl, [&] {
      return strprintf("ncclAllGather of %zu elements per rank in the %s group", count, g.name);
    });
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
    nccl_settle(ncclAllReduce(send, recv, count, nccl_type(t), ncclSum, g.nccl, comm_stream), g.nccl, [&] {
      return strprintf("ncclAllReduce of %zu elements in the %s group", count, g.name);
    });
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
    nccl_settle(ncclBroadcast(buf, buf, bytes, ncclUint8, root, g.nccl, comm_stream), g.nccl, [&] {
      return strprintf("ncclBroadcast of %zu bytes in the %s group", bytes, g.name);
    });
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
// Flat NCCL algorithms over one group (all-reduce, reduce-scatter and broadcast are one group collective)

void Communicator::Impl::nccl_all_to_all_v(const Group& g, const char* send, const std::vector<size_t>& scount,
                                           char* recv, const std::vector<size_t>& rcount, DataType t) {
  const size_t es = dtype_size(t);
  const int W = g.size, me = g.rank;
  std::vector<size_t> sd = prefix_sums(scount), rd = prefix_sums(rcount);
  // This rank's own block goes in the group too: NCCL copies it while the peers' blocks travel.
  std::vector<P2p> sends, recvs;
  for (int k = 0; k < W; ++k) {
    int to = (me + k) % W, from = (me - k + W) % W;
    sends.push_back({const_cast<char*>(send) + sd[to] * es, scount[to] * es, to});
    recvs.push_back({recv + rd[from] * es, rcount[from] * es, from});
  }
  group_p2p(g, sends, recvs, 0);
}

void Communicator::Impl::nccl_all_gather_v(const Group& g, const char* send, char* recv,
                                           const std::vector<size_t>& counts, DataType t) {
  const size_t es = dtype_size(t);
  const int W = g.size, me = g.rank;
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
}

}  // namespace sparta
