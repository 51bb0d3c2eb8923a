// hierarchical.cpp: the hierarchical algorithms of mode hier (described in communicator.h): the node group
// (NCCL on cuda, MPI on the node communicator on cpu) and the cross group (MPI, possibly staged) working at
// once. Nodes are uniform here (checked at construction): rank_at[m][l] is local rank l of node m.
//
// Ordering rules that keep every rank in step: work in the node group is queued in the same order on every
// rank of a node (node order n+1, n+2, ... and chunk order), and MPI steps start and complete in order
// (run_steps), so the `after` hooks that queue node work fire in that order too.
#include <algorithm>

#include "comm/comm_impl.h"

namespace sparta {

void Communicator::Impl::hier_all_to_all_v(const char* send, const std::vector<size_t>& scount, char* recv,
                                           const std::vector<size_t>& rcount, DataType t, bool fixed) {
  // One rank per node: cross rank = world rank. One node: local rank = world rank.
  if (local_size == 1) return flat_all_to_all_v(cross, false, send, scount, recv, rcount, t);
  if (num_nodes == 1) return flat_all_to_all_v(node_group, cuda, send, scount, recv, rcount, t);
  const size_t es = dtype_size(t);
  const int N = num_nodes, L = local_size, n = node, j = local;
  std::vector<size_t> sd = prefix_sums(scount), rd = prefix_sums(rcount);
  if (scount[rank] != rcount[rank])
    fail(strprintf("this rank sends %zu elements to itself but expects %zu from itself", scount[rank], rcount[rank]));

  // 0. c[l*N + m] = what node peer l sends to (m, j).
  std::vector<uint64_t> c(static_cast<size_t>(L) * N, fixed ? scount[0] : 0);
  if (!fixed) {
    std::vector<uint64_t> out(static_cast<size_t>(L) * N);
    for (int l = 0; l < L; ++l)
      for (int m = 0; m < N; ++m) out[l * N + m] = scount[rank_at[m][l]];
    std::vector<MPI_Request> req(1);
    check_mpi(MPI_Ialltoall(out.data(), N, MPI_UINT64_T, c.data(), N, MPI_UINT64_T, node_group.mpi, req.data()),
              "MPI_Ialltoall of the per-node counts in the node group");
    wait_requests(req, "the per-node counts of the node peers");
  }

  // Scratch [m][l] for what node peer l has for (m, j), m a remote node, l another rank of this node.
  std::vector<size_t> off(static_cast<size_t>(N) * L, 0);
  size_t scratch_total = 0;
  for (int m = 0; m < N; ++m)
    for (int l = 0; l < L; ++l)
      if (m != n && l != j) off[m * L + l] = scratch_total, scratch_total += c[l * N + m] * es;
  char* inter = scratch_bytes(scratch_total);

  // 1. Inside the node, one group per destination node, remote nodes first.
  std::vector<Ready> group_done(N);
  for (int k = 1; k <= N; ++k) {
    const int m = (n + k) % N;
    std::vector<P2p> sends, recvs;
    for (int l = 0; l < L; ++l) {
      if (l == j) continue;
      const int dst = rank_at[m][l];
      sends.push_back({const_cast<char*>(send) + sd[dst] * es, scount[dst] * es, l});
      char* where = m == n ? recv + rd[rank_at[n][l]] * es : inter + off[m * L + l];
      recvs.push_back({where, c[l * N + m] * es, l});
    }
    if (m == n) copy(recv + rd[rank] * es, send + sd[rank] * es, scount[rank] * es, comm_stream);
    group_done[m] = group_p2p(node_group, sends, recvs, m);
    pending.push_back(group_done[m]);
  }

  // 2. Across nodes: one message stream per source local rank l (tag l), straight into place.
  const bool stg = staged(false);
  std::vector<Step> steps;
  for (int k = 1; k < N; ++k) {
    const int m = (n - k + N) % N;
    for (int l = 0; l < L; ++l) {
      const int src = rank_at[m][l];
      add_recv(steps, cross, recv + rd[src] * es, rcount[src] * es, m, kTag + 1 + l, stg);
    }
  }
  for (int k = 1; k < N; ++k) {  // this rank's own pieces: ready now
    const int m = (n + k) % N;
    const int dst = rank_at[m][j];
    add_send(steps, cross, send + sd[dst] * es, scount[dst] * es, m, kTag + 1 + j, Ready(), stg);
  }
  for (int k = 1; k < N; ++k) {  // the node peers' pieces: once group m is done
    const int m = (n + k) % N;
    for (int l = 0; l < L; ++l)
      if (l != j) add_send(steps, cross, inter + off[m * L + l], c[l * N + m] * es, m, kTag + 1 + l, group_done[m], stg);
  }
  run_steps(steps);
}

void Communicator::Impl::hier_all_reduce(const char* send, char* recv, size_t count, DataType t) {
  if (local_size == 1) return flat_all_reduce(cross, false, send, recv, count, t);
  if (num_nodes == 1) return flat_all_reduce(node_group, cuda, send, recv, count, t);
  const size_t es = dtype_size(t);
  const size_t L = local_size, j = local;
  const size_t shard = count / L, main = shard * L, tail = count - main;
  const size_t per = std::max<size_t>(1, opt.chunk_bytes / (es * L));

  // MPI's reduce-scatter may not alias its input and output: in place on cpu, reduce from a copy.
  const char* rs_src = send;
  if (!cuda && send == recv && main > 0) {
    host_tmp.assign(send, send + main * es);
    rs_src = host_tmp.data();
  }
  struct Chunk {
    size_t base, cs;  // first element of the chunk, elements per rank
    Ready rs;
  };
  std::vector<Chunk> chunks;
  for (size_t a = 0; a < shard; a += per) {
    const size_t cs = std::min(per, shard - a), base = a * L;
    Ready r = group_reduce_scatter(node_group, rs_src + base * es, recv + (base + j * cs) * es, cs, t);
    pending.push_back(r);
    chunks.push_back({base, cs, r});
  }
  Ready tail_done;
  if (tail > 0) {
    tail_done = group_all_reduce(node_group, send + main * es, recv + main * es, tail, t);
    pending.push_back(tail_done);
  }

  const bool stg = staged(true);
  std::vector<Step> steps;
  for (const Chunk& ch : chunks) {
    char* piece = recv + (ch.base + j * ch.cs) * es;
    size_t before = steps.size();
    add_all_reduce(steps, cross, piece, piece, ch.cs, t, ch.rs, stg);
    SPARTA_ASSERT(steps.size() == before + 1, "a pipeline chunk of %zu elements became %zu MPI calls", ch.cs,
                  steps.size() - before);
    steps.back().after = [this, piece, recv, es, ch, t] {
      pending.push_back(group_all_gather(node_group, piece, recv + ch.base * es, ch.cs, t));
    };
  }
  if (tail > 0) add_all_reduce(steps, cross, recv + main * es, recv + main * es, tail, t, tail_done, stg);
  run_steps(steps);
}

void Communicator::Impl::hier_reduce_scatter(const char* send, char* recv, size_t rc, DataType t) {
  if (local_size == 1) return flat_reduce_scatter(cross, false, send, recv, rc, t);
  if (num_nodes == 1) return flat_reduce_scatter(node_group, cuda, send, recv, rc, t);
  if (rc == 0) return;
  const size_t es = dtype_size(t), blk = rc * es;
  const int N = num_nodes, L = local_size;
  // Node m's L blocks must be contiguous for the node's reduce-scatter: pack them when the world order is
  // not node-major.
  const size_t pack_bytes = node_major ? 0 : static_cast<size_t>(size) * blk;
  char* scr = scratch_bytes(pack_bytes + static_cast<size_t>(N) * blk);
  const char* base = send;
  if (!node_major) {
    for (int m = 0; m < N; ++m)
      for (int l = 0; l < L; ++l)
        copy(scr + (static_cast<size_t>(m) * L + l) * blk, send + rank_at[m][l] * blk, blk, comm_stream);
    base = scr;
  }
  char* part = scr + pack_bytes;  // [N][rc]: this node's partial sum of block (m, local) for every node m
  Ready all;
  for (int m = 0; m < N; ++m) {
    Ready r = group_reduce_scatter(node_group, base + static_cast<size_t>(m) * L * blk, part + m * blk, rc, t);
    pending.push_back(r);
    if (r.event) all.event = r.event;  // one stream: the last event covers the earlier ones
    all.reqs.insert(all.reqs.end(), r.reqs.begin(), r.reqs.end());
  }
  std::vector<Step> steps;
  add_reduce_scatter(steps, cross, part, recv, rc, t, all, staged(true));
  run_steps(steps);
}

void Communicator::Impl::hier_all_gather_v(const char* send, char* recv, const std::vector<size_t>& counts,
                                           DataType t) {
  if (local_size == 1) return flat_all_gather_v(cross, false, send, recv, counts, t);
  if (num_nodes == 1) return flat_all_gather_v(node_group, cuda, send, recv, counts, t);
  const size_t es = dtype_size(t);
  const int N = num_nodes, L = local_size, n = node, j = local;
  std::vector<size_t> d = prefix_sums(counts);
  copy(recv + d[rank] * es, send, counts[rank] * es, comm_stream);

  // Node phase for node m: pass block (m, j) to every node peer, take (m, l) from each.
  auto share = [&](int m) {
    std::vector<P2p> sends, recvs;
    const int mine = rank_at[m][j];
    for (int l = 0; l < L; ++l) {
      if (l == j) continue;
      const int theirs = rank_at[m][l];
      sends.push_back({recv + d[mine] * es, counts[mine] * es, l});
      recvs.push_back({recv + d[theirs] * es, counts[theirs] * es, l});
    }
    pending.push_back(group_p2p(node_group, sends, recvs, m));
  };
  share(n);

  const bool stg = staged(false);
  std::vector<Step> steps;
  for (int k = 1; k < N; ++k) {
    const int m = (n + k) % N;
    const int src = rank_at[m][j];
    add_recv(steps, cross, recv + d[src] * es, counts[src] * es, m, kTag, stg);
    Step marker;  // completes once block (m, j) is complete, even when it is empty
    marker.what = strprintf("block of rank %d", src);
    marker.after = [&share, m] { share(m); };
    steps.push_back(std::move(marker));
  }
  for (int k = 1; k < N; ++k) add_send(steps, cross, send, counts[rank] * es, (n + k) % N, kTag, Ready(), stg);
  run_steps(steps);
}

void Communicator::Impl::hier_broadcast(char* buf, size_t bytes, int root) {
  if (local_size == 1) return flat_broadcast(cross, false, buf, bytes, root);
  if (num_nodes == 1) return flat_broadcast(node_group, cuda, buf, bytes, root);
  const int nr = node_of[root], jr = local_of[root];
  const size_t chunk = opt.chunk_bytes;
  if (local != jr) {
    // Chunks arrive from node peer jr in order; the node group's calls wait for it.
    for (size_t off = 0; off < bytes; off += chunk)
      pending.push_back(group_broadcast(node_group, buf + off, std::min(chunk, bytes - off), jr));
    return;
  }
  std::vector<Step> steps;
  add_broadcast(steps, cross, buf, bytes, nr, chunk, staged(true));
  for (size_t i = 0; i < steps.size(); ++i) {
    const size_t off = i * chunk, len = std::min(chunk, bytes - off);
    steps[i].after = [this, buf, off, len, jr] {
      pending.push_back(group_broadcast(node_group, buf + off, len, jr));
    };
  }
  run_steps(steps);
}

}  // namespace sparta
