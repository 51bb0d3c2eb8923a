// flat_mpi.cpp: the MPI pipeline and the flat MPI algorithms. A pipeline is a list of non-blocking MPI calls
// (Step) that start and complete in order, each either on the buffers themselves (host buffers, or device
// buffers of a CUDA-aware library for point-to-point) or staged through pinned host memory in chunks:
// device-to-host copies of later chunks run while earlier ones are on the wire. The hierarchical algorithms
// build their inter-node phase from the same steps.
#include "comm/comm_impl.h"

#include <algorithm>
#include <climits>

namespace sparta {

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
  char* base = total > 0 ? staging_bytes(total) : nullptr;
  auto slice = [&](size_t i) { return steps[i].stage_bytes ? base + off[i] : nullptr; };
  (void)any_direct;

#if SPARTA_CUDA
  // MPI reads and writes device memory from the host: only once the caller's stream's earlier work is done
  // (a host wait that communicator.h names: MPI cannot follow a stream).
  if (cuda && any_direct) wait_event(input_ev, "the caller's stream's work queued before this operation");
  std::vector<CudaEvent> in_done(n, nullptr);
#endif
  // Device→host copies of every staged step are queued at once; each MPI call starts when its copy is done.
  for (size_t i = 0; i < n; ++i) {
    Step& s = steps[i];
    if (!s.copy_in) continue;
#if SPARTA_CUDA
    if (cuda) {
      order_copy_stream();
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
    // The copies out of the staging buffer are queued; staging_bytes waits for them before its next use.
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
// Flat MPI algorithms over one group

void Communicator::Impl::mpi_all_to_all_v(const Group& g, const char* send, const std::vector<size_t>& scount,
                                          char* recv, const std::vector<size_t>& rcount, DataType t) {
  const size_t es = dtype_size(t);
  const int W = g.size, me = g.rank;
  std::vector<size_t> sd = prefix_sums(scount), rd = prefix_sums(rcount);
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

void Communicator::Impl::mpi_all_reduce(const Group& g, const char* send, char* recv, size_t count, DataType t) {
  std::vector<Step> steps;
  add_all_reduce(steps, g, send, recv, count, t, Ready(), staged(true));
  run_steps(steps);
}

void Communicator::Impl::mpi_reduce_scatter(const Group& g, const char* send, char* recv, size_t rc, DataType t) {
  std::vector<Step> steps;
  add_reduce_scatter(steps, g, send, recv, rc, t, Ready(), staged(true));
  run_steps(steps);
}

void Communicator::Impl::mpi_all_gather_v(const Group& g, const char* send, char* recv,
                                          const std::vector<size_t>& counts, DataType t) {
  std::vector<Step> steps;
  add_all_gather_v(steps, g, send, recv, counts, t, staged(true));
  run_steps(steps);
}

void Communicator::Impl::mpi_broadcast(const Group& g, char* buf, size_t bytes, int root) {
  const bool stg = staged(true);
  std::vector<Step> steps;
  add_broadcast(steps, g, buf, bytes, root, stg ? opt.chunk_bytes : kDirectChunk, stg);
  run_steps(steps);
}

}  // namespace sparta
