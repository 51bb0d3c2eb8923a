#!/usr/bin/env python3
"""Scaling model: the step time of a DLRM-like plan on N nodes x G GPUs, per placement and communication mode,
from kernel rates and link parameters. The equations are in README ("Scaling model"); the inputs in
experiments/scaling_model.json.

    experiments/scaling_model.py                                   # MLPerf DLRM v1 shapes, 1..64 nodes of 8 GPUs
    experiments/scaling_model.py --model dcnv2 --plot model.png --out model.jsonl
    experiments/scaling_model.py --calibrate results/embedding/results.jsonl results/alltoall/results.jsonl
    experiments/scaling_model.py --check measured.jsonl [--calibrate ...]   # error of each measured point

--calibrate takes rates from measured JSON lines: lookup GB/s (bench_embedding eval/train records: the median
of GBps at the largest batch), backward GB/s (embedding_step records: backward bytes / backward_update_ms),
NVLink bandwidth and latency (bench_alltoall nccl all-to-all on one node: the best busbw, the smallest time),
the link between nodes (bench_alltoall hier or mpi records across nodes: the all-to-all's median busbw from 4 MB
and smallest time; half duplex when every such record ran on one host, i.e. emulated nodes; the all-reduce's rate
at each size measured, with one rank per node), dense TFLOP/s (records with dense_TFLOPs). --check predicts each
measured record it understands and prints the error: bench_alltoall (the collective's time; mode hier as hier,
nccl and mpi as the flat model), bench_embedding (the lookup, the step), and trainer records with placement,
step_ms or ms_step, ranks, nodes, global_batch (or batch, read as global) and comm_mode (the whole step with the
config's model shapes).
"""
import argparse
import json
import math
import os
import re
import statistics
import sys

PLACEMENTS = ("dispatch", "localized", "distributed", "replicated", "hybrid")
MODES = ("nccl", "hier")


def fail(msg):
    sys.exit(f"scaling_model: {msg}")


# ---------------------------------------------------------------------------------------------------------
# Inputs


def load_config(path, model_name=None):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        fail(f"{path}: cannot read ({e.strerror})")
    except json.JSONDecodeError as e:
        fail(f"{path}: not JSON ({e})")
    for key in ("model", "rates", "links"):
        if key not in cfg:
            fail(f"{path}: field '{key}' is missing")
    if model_name and model_name != "default":
        variants = cfg.get("models", {})
        if model_name not in variants:
            fail(f"--model: '{model_name}' is not in {path}'s models ({', '.join(['default'] + list(variants))})")
        cfg["model"] = dict(cfg["model"], **variants[model_name])
    m = cfg["model"]
    if len(m["cardinalities"]) != len(m["hotness"]):
        fail(f"{path}: model: {len(m['cardinalities'])} cardinalities but {len(m['hotness'])} hotness values")
    return cfg


def mlp_params(sizes_in, layers):
    p, n = 0, sizes_in
    for out in layers:
        p += n * out + out
        n = out
    return p


def dense_flops_per_sample(m):
    """(forward + backward flops of the dense part per sample, its parameters). dot (m's dense_model, the default):
    3 x (2 x MLP weights + the pairwise dots), the top MLP over the pairs and the bottom output. dcnv2: the low-rank
    cross network over x0 = [bottom output, the tables' vectors] (cross_layers of V [rank, width], U [width, rank]
    and a bias [width], as src/model.h lays them out; cross_rank 512, 3 layers by default), then the top MLP over
    x0's width: 3 x 2 x every weight."""
    tables = len(m["cardinalities"])
    bottom = mlp_params(m["dense_features"], m["bottom_mlp"])
    if m.get("dense_model") == "dcnv2":
        width = m.get("top_input", m["bottom_mlp"][-1] + tables * m["dim"])
        rank, layers = m.get("cross_rank", 512), m.get("cross_layers", 3)
        cross = layers * (2 * rank * width + width)
        top = mlp_params(width, m["top_mlp"])
        return 3 * 2 * (bottom + cross + top), bottom + cross + top
    vectors = tables + 1
    pairs = vectors * (vectors - 1) // 2
    top = mlp_params(m.get("top_input", pairs + m["bottom_mlp"][-1]), m["top_mlp"])
    return 3 * (2 * (bottom + top) + 2 * pairs * m["dim"]), bottom + top


# ---------------------------------------------------------------------------------------------------------
# Links: collective times. S is bytes per rank (all-to-all: a rank's whole send buffer; all-reduce: the
# buffer; reduce-scatter: the input; all-gather: the output). W = N * G ranks. Across nodes, mode nccl is NCCL
# over every GPU; mode hier is NCCL inside the node and MPI between nodes (comm/hierarchical.cpp; one rank per
# node: flat MPI), whose collectives on device buffers go through pinned host memory (comm/flat_mpi.cpp).


def link(cfg):
    l = cfg["links"]
    bib = l["ib_Gbps_per_gpu"] / 8 * l.get("ib_efficiency", 1.0) * 1e9
    return {"bnv": l["nvlink_GBps"] * 1e9, "anv": l["nvlink_latency_us"] * 1e-6,
            "bib": bib, "aib": l["ib_latency_us"] * 1e-6,
            # MPI's reductions across nodes (all-reduce, reduce-scatter): the link, or what reducing on the way
            # allows (ib_reduce_Gbps: an MPI that reduces in host memory reaches less than its link), or, calibrated,
            # the all-reduce records' rate at each size (ib_reduce_curve: [bytes, GB/s] pairs, see reduce_rate)
            "bred": min(bib, l.get("ib_reduce_Gbps", float("inf")) / 8 * 1e9),
            "bred_curve": sorted((float(s), g * 1e9) for s, g in l.get("ib_reduce_curve", [])),
            # inter_duplex "half": a rank's sent and received bytes share the link between nodes (emulated nodes of
            # one host: see calibrate); "full" (InfiniBand): each direction has the bus bandwidth
            "half": l.get("inter_duplex", "full") == "half",
            "o": l.get("per_peer_us", 0.0) * 1e-6}


def reduce_rate(L, S):
    """Bus bandwidth (bytes/s) of MPI's all-reduce across nodes on S bytes: the config's one rate, or the calibrated
    curve at S, interpolated in log S between the sizes measured and flat beyond them (the emulated link's rate
    falls from 2.5-2.8 GB/s up to 16 MB to 1.1-1.2 GB/s from 64 MB: no one rate covers both)."""
    c = L.get("bred_curve")
    if not c:
        return L["bred"]
    if S <= c[0][0]:
        return c[0][1]
    for (s0, r0), (s1, r1) in zip(c, c[1:]):
        if S <= s1:
            return r0 + (r1 - r0) * math.log(S / s0) / math.log(s1 / s0)
    return c[-1][1]


def all_to_all_s(S, N, G, mode, L):
    W = N * G
    if W == 1 or S == 0:
        return 0.0
    bib = L["bib"]
    if mode == "hier" and N > 1:
        # intra-node exchange of everything bound off this GPU's local peers, then the inter-node exchange
        # among the ranks of equal local rank, the two pipelined (one rank per node: the MPI exchange alone)
        return ((L["anv"] if G > 1 else 0.0) + L["aib"] + max(S * (G - 1) / G / L["bnv"], S * (N - 1) / N / bib)
                + L["o"] * ((G - 1) + (N - 1)))
    intra, inter = S * (G - 1) / W, S * (W - G) / W
    lat = L["aib"] if N > 1 else L["anv"]
    return lat + max(intra / L["bnv"], inter / bib if inter else 0.0) + L["o"] * (W - 1)


def mpi_all_reduce_s(s, N, L, inter="bred"):
    """MPI's all-reduce of s bytes among N ranks, one per node (mode hier's cross group). inter: the bandwidth,
    that of reductions (reduce_rate at s) or the link's (bib: an all-gather, which reduces nothing)."""
    return L["aib"] + 2 * (N - 1) / N * s / (reduce_rate(L, s) if inter == "bred" else L["bib"])


def all_reduce_s(S, N, G, mode, L, inter="bred"):
    """inter: as mpi_all_reduce_s's, for mode hier across nodes."""
    W = N * G
    if W == 1 or S == 0:
        return 0.0
    if N == 1:
        return L["anv"] + 2 * (W - 1) / W * S / L["bnv"]
    if mode == "hier":
        # reduce-scatter inside the node, all-reduce of 1/G across nodes, all-gather inside the node
        intra = 2 * L["anv"] + 2 * S * (G - 1) / G / L["bnv"] if G > 1 else 0.0
        return intra + mpi_all_reduce_s(S / G, N, L, inter)
    # one NCCL ring over every GPU, one NIC each; NCCL reduces on the GPUs, at the link's rate
    return L["aib"] + 2 * (W - 1) / W * S / min(L["bnv"], L["bib"])


def reduce_scatter_s(S, N, G, mode, L):
    """NCCL's (one node, or mode nccl): half its ring all-reduce. Mode hier across nodes: NCCL's inside the node,
    then MPI's across nodes of the node's partial blocks (S / G a rank). That one is Open MPI's non-blocking
    reduce-scatter (libnbc, which the staged path calls: comm/flat_mpi.cpp add_reduce_scatter): it reduces the
    whole buffer at one root, then scatters it, so it costs the MPI all-reduce of the buffer (whose reduction is
    the same), less what its scatter saves on the root's link: it sends (N - 1)/N of the buffer where the
    all-reduce broadcasts all of it. On a half-duplex link that is S / G / N at twice the bus bandwidth; on a
    full-duplex one nothing (the root's sends run beside its receives, which are the same in both)."""
    W = N * G
    if W == 1 or S == 0:
        return 0.0
    if N == 1 or mode != "hier":
        return all_reduce_s(S, N, G, mode, L) / 2
    s = S / G
    intra = L["anv"] + S * (G - 1) / G / L["bnv"] if G > 1 else 0.0
    saved = s / N / (2 * L["bib"]) if L["half"] else 0.0
    return intra + mpi_all_reduce_s(s, N, L) - saved


def all_gather_s(S, N, G, mode, L):
    return all_reduce_s(S, N, G, mode, L, inter="bib") / 2 if N * G > 1 else 0.0


def host_reduction_s(kind, S, N, G, mode, L):
    """Of a collective's time, the part MPI's root spends reducing in host memory rather than moving bytes: mode
    hier across nodes, the all-reduce's and the reduce-scatter's MPI part (S / G a rank; both reduce the whole
    buffer at a root): its time at the reduction rate less the same bytes at the link's. 0 elsewhere (NCCL reduces
    on the GPUs as the bytes arrive, an all-to-all or all-gather reduces nothing)."""
    if kind not in ("allreduce", "reducescatter") or mode != "hier" or N == 1 or S == 0:
        return 0.0
    f = 2 * (N - 1) / N * S / G
    return max(0.0, f / reduce_rate(L, S / G) - f / L["bib"])


COLLECTIVES = {"alltoall": all_to_all_s, "allreduce": all_reduce_s, "reducescatter": reduce_scatter_s,
               "allgather": all_gather_s}


# ---------------------------------------------------------------------------------------------------------
# Placements: bytes each moves per step, per rank


def hot_fraction(rows, hot_rows, alpha):
    """Share of a table's lookups that hit its hot_rows most frequent rows when P(rank r) ~ r^-alpha."""
    if hot_rows >= rows:
        return 1.0
    if alpha == 1.0:
        return math.log(hot_rows + 1) / math.log(rows + 1)
    a = 1.0 - alpha
    return ((hot_rows + 1) ** a - 1) / ((rows + 1) ** a - 1)


def shapes(cfg):
    m = cfg["model"]
    rows = [min(c, m["max_rows"]) if m.get("max_rows") else c for c in m["cardinalities"]]
    return rows, m["hotness"], m["dim"], m["value_bytes"], m["key_bytes"]


def localized_assignment(costs, W):
    """Tables to ranks, largest cost first onto the least loaded rank: the load of each rank."""
    load = [0.0] * W
    for c in sorted(costs, reverse=True):
        i = load.index(min(load))
        load[i] += c
    return load


def collectives(cfg, placement, b, N, G):
    """[(collective, bytes per rank)] of one step's embedding traffic, and the lookup work of the busiest rank:
    (keys looked up, pooled bags written) per step."""
    rows, hot, d, e, k = shapes(cfg)
    W, T = N * G, len(rows)
    B = b * W
    nnz = b * sum(hot)  # keys a rank reads from its slice of the batch
    bags = b * T
    alpha = cfg["model"].get("key_alpha", 0.0) or 0.0
    if placement == "dispatch":
        # DispatchShard: a rank's distinct keys to their owners, one vector per distinct key back, one gradient sum
        # per distinct key to the owner
        u = sum(min(r, expected_distinct(r, b * h, alpha)) for r, h in zip(rows, hot))
        return [("alltoall", u * k), ("alltoall", u * d * e), ("alltoall", u * d * e)], (nnz, bags)
    if placement == "localized":
        load = localized_assignment([B * (h + 1) for h in hot], W)
        busiest = max(load)
        # one group of every owner's tables (src/placement_localized.cpp): each rank sends every owner its block
        # of bags (lengths and keys) and gets their pooled vectors back, then sends their gradients, each an
        # all-to-all of all ranks at once; the busiest owner receives W x its share of the work times an even
        # share, so a rank's share is scaled by that
        skew = W * busiest / sum(load)
        return ([("alltoall", skew * (nnz * k + bags * 8)), ("alltoall", skew * bags * d * e),
                 ("alltoall", skew * bags * d * e)],
                (busiest * sum(hot) / (sum(hot) + T), busiest * T / (sum(hot) + T)))
    if placement == "distributed":
        # a rank's keys and their bag ids to their owners; every owner pools partial sums for all B x T bags,
        # reduce-scattered; the bags' gradients all-gathered
        return ([("alltoall", nnz * k), ("alltoall", nnz * 8), ("reducescatter", B * T * d * e),
                 ("allgather", B * T * d * e)], (nnz, B * T / 1))
    if placement == "replicated":
        # every rank's distinct keys and their gradient sums (one per touched row, not per lookup): replicated_step
        colls = [replicated_step(r, h, b, W, d * e, 0, alpha)[1] for r, h in zip(rows, hot)]
        if W == 1:
            return [], (nnz, bags)
        return [(c, sum(x[i][1] for x in colls)) for i, (c, _) in enumerate(colls[0])], (nnz, bags)
    if placement == "hybrid":
        hr = cfg.get("hybrid_hot_rows", 65536)
        # the cold keys by dispatch (distinct cold keys); the hot rows' dense gradient sums and their counts
        # all-reduced
        cold = 0.0
        for r, h in zip(rows, hot):
            H = min(r, hr)
            kc = b * h * (1 - (hot_fraction(r, H, alpha) if alpha else H / r))
            cold += min(r, expected_distinct(r, kc, alpha, int(H)) if alpha else
                        (r - H) * -math.expm1(-kc / max(r - H, 1)))
        hot_rows = sum(min(r, hr) for r in rows)
        return ([("alltoall", cold * k), ("alltoall", cold * d * e), ("alltoall", cold * d * e),
                 ("allreduce", hot_rows * d * e), ("allreduce", hot_rows * 8)], (nnz, bags))
    fail(f"unknown placement '{placement}' (expected {', '.join(PLACEMENTS)})")


def memory_per_gpu(cfg, placement, W):
    m = cfg["model"]
    rows, _, d, e, _ = shapes(cfg)
    per_row = d * e * (1 + m.get("optimizer_state_per_value", 0)) / m.get("load_factor", 0.5) + 16
    total = sum(rows) * per_row
    if placement in ("dispatch", "distributed"):
        return total / W
    if placement == "localized":
        return max(localized_assignment([r * per_row for r in rows], W))
    if placement == "replicated":
        return total
    hr = cfg.get("hybrid_hot_rows", 65536)
    return total / W + sum(min(r, hr) for r in rows) * per_row


# ---------------------------------------------------------------------------------------------------------
# The collection's embedding step, counted from what each placement runs per step (src/placement_*.cpp,
# src/placement_common.cpp, kernels/route.cu), structured as the C++ planner's cost model (src/planner.cpp
# placement_cost; README "Planner"): per table the device bytes of its local passes, per group (the tables of one
# placement, every owner's for localized) a fixed cost, its host round trips (a count downloaded: the host waits
# for the stream), its collectives (count exchanges over MPI and the data collectives), the bytes the collectives
# carry (timed on the links above). Every per-key gradient sum runs in the table backward's fixed order
# (kernels/embedding_backward.h: a hot key's lookups over many warps), so no route has a long serial sum. On one
# rank nothing moves: replicated and localized look the bags up in place and update the rows from the bags'
# gradients; dispatch, distributed and hybrid keep their routing passes and their downloads, and copy their
# buffers instead of exchanging them. The fit (fit_params) gives one rate per term (EMB_TERMS).

KEY_PASS = 16.0  # one elementwise pass over n 8-byte keys or indices, read and written
BUCKET = 128.0  # a hash table's probe reads the key's first bucket: 8 slots of 16 bytes (kernels/hash_table_ref.cuh)
# a lookup's probe per key: the key read and its row written, and with hash slots their bucket (a direct index
# computes the row: kernels/hash_table.h DirectIndex)
PROBE = {"hashed": KEY_PASS + BUCKET, "direct": KEY_PASS}
SORT = 4 * KEY_PASS  # the table's backward sort: (row, bag) 32-bit pairs on the rows' bits, 4 passes of 8 bits
# route_sort_keys: (key, index) 64-bit pairs sorted on all 64 bits (tagged keys), 8 passes of 8 bits that each read
# and write 16 bytes, plus the indices' iota and the histogram's read
KEY_SORT = 8 * 32.0 + 16.0
# per group: (count exchanges over MPI, data collectives, host round trips on more than one rank, on one rank)
GROUP_WORK = {
    # the distinct count and the send counts downloaded, the counts exchanged; keys, vectors, gradients
    "dispatch": (1, 3, 2, 2),
    # the key counts of the owners' blocks downloaded and exchanged; lengths, keys, pooled vectors, their gradients
    "localized": (1, 4, 1, 0),
    # the send counts downloaded and exchanged; keys, bag ids, the partial sums' reduce-scatter, the all-gather
    "distributed": (1, 4, 1, 1),
    # replicated_step: the distinct count downloaded and exchanged; the all-gathers of keys and of sums
    "replicated": (1, 2, 1, 0),
    # the hot/cold counts, the cold dispatch's two, the hot keys' sums and the touched hot keys downloaded; the
    # cold dispatch's count exchange and three collectives, the hot sums' and hot counts' all-reduces
    "hybrid": (1, 5, 5, 5),
}
GROUP_COLLECTIVES = {p: w[0] + w[1] for p, w in GROUP_WORK.items()}
EMB_TERMS = ("comm", "local_GB", "collectives", "groups", "round_trips")
# A host round trip: an 8-byte device-to-host copy behind the stream's work, the host waiting for it, then the
# next launch (its fixed cost, not fitted; a config's host_round_trip_us replaces it)
HOST_ROUND_TRIP_US = 20.0


def expected_distinct(rows, draws, alpha, skip=0):
    """Expected distinct keys among draws lookups of a table whose key ranks follow r^-alpha (uniform at 0), the
    skip most frequent left out: sum over rows of 1 - (1 - p_r)^draws, summed over geometric buckets of ranks."""
    rows = int(rows)
    if rows <= 0 or draws <= 0:
        return 0.0
    if alpha == 0:
        p = 1.0 / rows
        return (rows - skip) * -math.expm1(draws * math.log1p(-p)) if p < 1 else float(rows - skip > 0)
    norm = _zipf_norm(rows, alpha)
    total, r = 0.0, skip + 1
    while r <= rows:
        r1 = min(rows, max(r, int(r * 1.05)))
        n = r1 - r + 1
        p = ((r + r1) / 2) ** -alpha / norm
        total += n * (-math.expm1(draws * math.log1p(-min(p, 1 - 1e-15))))
        r = r1 + 1
    return total


def _zipf_norm(rows, alpha):
    total, r = 0.0, 1
    while r <= rows:
        r1 = min(rows, max(r, int(r * 1.05)))
        total += (r1 - r + 1) * ((r + r1) / 2) ** -alpha
        r = r1 + 1
    return total


def bucket_bytes(n, parts):
    """route_bucket of n elements into parts: the indices' iota, the histogram's read, then one pass per 8 bits of
    the largest part over (part, index) int32/int64 pairs, read and written."""
    bits = max(1, math.ceil(math.log2(parts))) if parts > 1 else 1
    return n * (8 + 4 + 24 * math.ceil(bits / 8))


def _pooled(n, p, v, q):  # pooled lookup: each key's probe (q bytes: PROBE), its row read, the bags written
    return q * n + n * v + p * v


def _keys(n, v, q):  # unpooled lookup: probe, row read, vector written
    return q * n + 2 * n * v


def _update(n, r, v, s):  # the table's backward: sort, per-key gradient reads, the touched rows and state updated
    return SORT * n + n * v + r * (2 * v + 2 * s)


def _rows(n, v):  # route_gather_rows / route_scatter_rows: n rows moved through an index
    return 2 * n * v + 8 * n


def _dispatch_route(K, U, W):
    """DispatchShard's route of K keys (U distinct) over W ranks, in local bytes: what route ahead moves off the
    step (dispatch_route_terms)."""
    return (KEY_SORT * K + 3 * KEY_PASS * K  # sorted (64-bit), unique (flags, scan, runs)
            + 12 * U + bucket_bytes(U, W) + 24 * U  # owner, bucket, keys gathered in route order
            + 2 * KEY_PASS * U + 2 * KEY_PASS * K)  # where each key's vector arrives


def _dispatch_shard(K, U, Ur, Uo, v, s, W, q):
    """DispatchShard forward + backward on K keys (U distinct, Ur received from every rank, Uo rows touched at the
    owner), up to the distinct keys' vectors as they arrived and from the keys' bag gradients back: (local bytes,
    bytes its exchanges copy on one rank). The caller pools the bags from the arrived vectors."""
    fwd = _dispatch_route(K, U, W) + _keys(Ur, v, q)  # the route, the owner's lookup of the keys it received
    # summed per distinct key from the bags' gradients, grouped by the row each key's vector came in (the sums in
    # send order: no gather since b5175a9; the sort queued while the forward's vectors travel, still counted)
    bwd = (SORT * K + (K + U) * v
           + 8 * Ur + _update(Ur, Uo, v, s))  # one bag per received key at the owner
    return fwd + bwd, 16 * U + 2 * U * v + 2 * Ur * v


def replicated_step(R, h, b, W, v, s, alpha, q=PROBE["hashed"]):
    """Replicated's work for one table (src/placement_replicated.cpp, ReplicaShard::update_from_all): (local bytes,
    [(collective, bytes per rank)]). Forward: one pooled lookup. Backward on one rank: the bags' update straight
    from their gradients. On more than one rank: this rank's per-row gradient sums (the table's sort and reduction
    over all K lookups: U sums and their keys written), the U count downloaded and exchanged, the all-gathers of
    every rank's distinct keys and of their sums (W U each), the gathered keys inserted in this copy (rows only),
    and one update over the W U gathered sums (Ug rows touched). The counts: GROUP_WORK["replicated"]."""
    K, P = b * h, b
    U = min(R, expected_distinct(R, K, alpha))
    if W == 1:
        return _pooled(K, P, v, q) + _update(K, U, v, s), []
    Ug = min(R, expected_distinct(R, W * K, alpha))
    local = (_pooled(K, P, v, q) + SORT * K + K * v + U * v + 8 * U  # lookup; row sums and their keys
             + KEY_PASS * W * U + 8 * W * U + _update(W * U, Ug, v, s))  # insert, iota, update of the gathered
    return local, [("allgather", W * U * 8), ("allgather", W * U * v)]


def table_work(placement, R, h, b, W, v, s, alpha, hot_rows, index="hashed"):
    """Device bytes of the table's local passes on one rank: one slot per table (P = b bags), K = b h keys; index:
    hashed or direct (the probe, PROBE; a hybrid table's hot copy is hashed either way)."""
    q = PROBE[index]
    K, P = b * h, b
    U, Ug = min(R, expected_distinct(R, K, alpha)), min(R, expected_distinct(R, W * K, alpha))
    if placement == "replicated":
        return replicated_step(R, h, b, W, v, s, alpha, q)[0]
    if W == 1 and placement == "localized":
        return _pooled(K, P, v, q) + _update(K, U, v, s)
    if placement == "localized":  # the owner's share: the global batch's bags of this table
        return 16 * W * P + _pooled(W * K, W * P, v, q) + _update(W * K, Ug, v, s)
    if placement == "dispatch":
        local, copied = _dispatch_shard(K, U, U, Ug / W, v, s, W, q)
        local += (K + P) * v  # the bags pooled from the arrived vectors
        return local + (copied if W == 1 else 0.0)
    if placement == "distributed":
        # bag ids, owners, bucket, keys and bag ids gathered by owner; the owner's CSR of the W P bags, its partial
        # sums of them (the reduce-scatter leaves this rank's in the output); backward: the bags' gradients go as
        # they are (sum tables of equal local batches), the owner's update
        local = (16 * K + 12 * K + bucket_bytes(K, W) + 2 * 24 * K + 8 * W * P + _pooled(K, W * P, v, q)
                 + _update(K, Ug / W, v, s))
        copied = 32 * K + 4 * P * v  # keys and bag ids; the reduce-scatter's and the all-gather's buffers
        return local + (copied if W == 1 else 0.0)
    if placement == "hybrid":
        H = min(R, hot_rows)
        x = hot_fraction(R, H, alpha) if alpha else H / R
        Kh = K * x
        Kc = K - Kh
        Uc = min(R, expected_distinct(R, Kc, alpha, int(H)) if alpha else (R - H) * -math.expm1(-Kc / max(R - H, 1)))
        Ucg = min(R, expected_distinct(R, W * Kc, alpha, int(H)) if alpha else
                  (R - H) * -math.expm1(-W * Kc / max(R - H, 1)))
        Th = min(H, expected_distinct(R, W * Kh, alpha) if alpha else H * -math.expm1(-W * Kh / max(H, 1)))
        cold, copied = _dispatch_shard(Kc, Uc, Uc, Ucg / W, v, s, W, q)
        search = 8 * K * max(1.0, math.log2(max(H, 2)))  # binary search of the hot set per key
        fwd = (search + 4 * K + bucket_bytes(K, 2) + 24 * K  # hot or cold, split, keys gathered
               + 4 * KEY_PASS * K  # each key's place among the split keys, its bag in split order
               + _keys(Kh, v, PROBE["hashed"]) + _rows(Kc, v) + (K + P) * v)  # hot lookup; cold vectors; bags pooled
        bwd = (2 * 8 * P  # the hot and the cold keys' bags
               + 8 * Kh * max(1.0, math.log2(max(H, 2))) + bucket_bytes(Kh, H)  # by hot key
               + 16 * H + 3 * KEY_PASS * Kh  # offsets; each hot key's id in the hot set
               + SORT * Kh + (Kh + H) * v + 3 * H * v  # the sums per hot key into a zeroed [H, dim]
               + 8 * H + 4 * H + bucket_bytes(H, 2) + 24 * Th + _rows(Th, v)  # touched hot keys and sums
               + _keys(Th, v, PROBE["hashed"]) + 8 * Th + _update(Th, Th, v, s))  # their rows looked up, one update each
        return fwd + bwd + cold + (copied if W == 1 else 0.0)
    fail(f"unknown placement '{placement}' (expected {', '.join(PLACEMENTS)})")


def dispatch_route_terms(cfg, mode, N, G, b):
    """The part of dispatch's embedding_terms that a trainer with route ahead (embedding.route_ahead, bench_train
    records with route_ahead true) runs beside the step before's dense layers: each table's keys sorted, their
    distinct set, owner buckets and the place each key's vector arrives (_dispatch_route), the two
    count downloads, the count exchange and the keys' all-to-all (src/embedding_collection.h "Route ahead")."""
    m = cfg["model"]
    rows, hot, d, e, k = shapes(cfg)
    W = N * G
    alpha = m.get("key_alpha", 0.0) or 0.0
    local, keys = 0.0, 0.0
    for R, h in zip(rows, hot):
        K = b * h
        U = min(R, expected_distinct(R, K, alpha))
        local += _dispatch_route(K, U, W)
        keys += U
    comm = all_to_all_s(keys * k, N, G, mode, link(cfg)) if W > 1 else 0.0
    return {"comm": comm, "reduce": 0.0, "local_GB": local / 1e9, "collectives": 2 if W > 1 else 0, "groups": 0,
            "round_trips": 2, "new_rows": 0.0}


def embedding_terms(cfg, placement, mode, N, G, b):
    """The terms of one step's embedding time on the busiest rank: comm (s: the placement's collectives on the
    links), reduce (s: their MPI roots' reductions in host memory, host_reduction_s: not link time), local_GB
    (device bytes of its local passes, GB), collectives, groups and round_trips (each a fixed cost), new_rows (rows
    a rank's hash tables insert per step: model.new_rows_per_rank, 0 for tables that hold every key)."""
    m = cfg["model"]
    rows, hot, d, e, _ = shapes(cfg)
    W = N * G
    v = d * e
    s = v * m.get("optimizer_state_per_value", 0)
    alpha = m.get("key_alpha", 0.0) or 0.0
    hr = cfg.get("hybrid_hot_rows", 65536)
    index = m.get("index", "hashed")
    per_table = [table_work(placement, R, h, b, W, v, s, alpha, hr, index) for R, h in zip(rows, hot)]
    if placement == "localized" and W > 1:
        owners = m.get("owners")
        if owners and len(owners) == len(rows) and max(owners) < W:
            load = [0.0] * W
            for o, x in zip(owners, per_table):
                load[o] += x
        else:
            load = localized_assignment(per_table, W)
        # every rank: its bags' lengths, cut into the owners' blocks (offsets twice, keys once), the pooled vectors
        # that come back put into place and the gradients taken out (read and written)
        local = max(load) + sum(3 * 16 * b + 16 * b * h + 4 * b * v for h in hot)
        groups = 1
    else:
        local = sum(per_table)
        groups = 1
    L = link(cfg)
    colls, _ = collectives(cfg, placement, b, N, G)
    comm = sum(COLLECTIVES[c](S, N, G, mode, L) for c, S in colls) if W > 1 else 0.0
    reduce = sum(host_reduction_s(c, S, N, G, mode, L) for c, S in colls) if W > 1 else 0.0
    ex, dc, rt, rt1 = GROUP_WORK[placement]
    ncoll = (ex + dc) * groups if W > 1 else 0
    trips = (rt if W > 1 else rt1) * groups
    return {"comm": comm - reduce, "reduce": reduce, "local_GB": local / 1e9, "collectives": ncoll, "groups": groups,
            "round_trips": trips, "new_rows": m.get("new_rows_per_rank", 0.0)}


def link_ms(terms, rates):
    """The collectives' part of the embedding step (ms): their bytes on the links times comm_scale (fitted on one
    node, where every collective is NCCL's: it scales the time bytes spend on a link), and MPI's host reductions
    across nodes (not link time: unscaled)."""
    return 1e3 * (terms["comm"] * rates["comm_scale"] + terms.get("reduce", 0.0))


def embedding_ms(terms, rates, scale=1.0):
    """The embedding step (ms) from its terms and fitted rates: comm_scale (x the links' time), hbm_GBps,
    collective_us, group_us, round_trip_us (0 when absent).
    scale: a factor on every term but the links' time (the training step's embedding phase, whose local work runs
    at other rates than the collection's and whose collectives cross the same links)."""
    return link_ms(terms, rates) + scale * 1e3 * (
        terms["local_GB"] / rates["hbm_GBps"]
        + 1e-6 * (terms["collectives"] * rates["collective_us"] + terms["groups"] * rates["group_us"]
                  + terms.get("round_trips", 0) * rates.get("round_trip_us", 0.0))
        + 1e-9 * terms.get("new_rows", 0.0) * rates.get("new_row_ns", 0.0))


def _solve(A, y):
    """Least squares A x = y (normal equations, Gaussian elimination); None when singular."""
    n = len(A[0])
    M = [[sum(a[i] * a[j] for a in A) for j in range(n)] + [sum(a[i] * t for a, t in zip(A, y))] for i in range(n)]
    for c in range(n):
        p = max(range(c, n), key=lambda r: abs(M[r][c]))
        if abs(M[p][c]) < 1e-12 * max(1.0, max(abs(M[r][r]) for r in range(n))):
            return None
        M[c], M[p] = M[p], M[c]
        for r in range(n):
            if r != c:
                f = M[r][c] / M[c][c]
                M[r] = [a - f * bb for a, bb in zip(M[r], M[c])]
    return [M[i][n] / M[i][i] for i in range(n)]


def nnls_relative(X, y, fixed=None):
    """Non-negative least squares on relative error (each row divided by its y) over every subset of the columns
    (few columns): the coefficients with the smallest residual, 0 where a column is left out. fixed: a known part
    of each y (not fitted)."""
    n = len(X[0])
    A = [[x / t for x in row] for row, t in zip(X, y)]
    ones = [1.0 - f / t for f, t in zip(fixed or [0.0] * len(y), y)]
    best, best_res = [0.0] * n, float("inf")
    for mask in range(1, 1 << n):
        cols = [j for j in range(n) if mask >> j & 1 and any(a[j] for a in A)]
        if not cols or len(cols) != bin(mask).count("1"):
            continue
        sol = _solve([[a[j] for j in cols] for a in A], ones)
        if sol is None or min(sol) < 0:
            continue
        coef = [0.0] * n
        for j, c in zip(cols, sol):
            coef[j] = c
        res = sum((sum(c * a[j] for j, c in enumerate(coef)) - o) ** 2 for a, o in zip(A, ones))
        if res < best_res - 1e-12:
            best, best_res = coef, res
    return best


def lookup_s(cfg, keys, bags, rates):
    _, _, d, e, _ = shapes(cfg)
    fwd = (keys * d * e + bags * d * e) / (rates["lookup_GBps"] * 1e9)
    bwd = (2 * keys * d * e + bags * d * e) / (rates["backward_GBps"] * 1e9)
    return fwd, bwd


def predict(cfg, placement, mode, N, G, b, rates=None):
    """Predicted step of one rank (the slowest): a dict of its parts in ms and the total."""
    rates = rates or cfg["rates"]
    L = link(cfg)
    W = N * G
    colls, (keys, bags) = collectives(cfg, placement, b, N, G)
    fwd, bwd = lookup_s(cfg, keys, bags, rates)
    comm = sum(COLLECTIVES[c](S, N, G, mode, L) for c, S in colls)
    flops, params = dense_flops_per_sample(cfg["model"])
    dense = b * flops / (rates["dense_TFLOPs"] * 1e12)
    if cfg.get("fit", {}).get("dense_ms_per_sample"):  # fitted per (model, precision)
        m = dict(cfg["model"], dense_model=cfg["model"].get("dense_model", "dot"))
        dense = 1e-3 * dense_ms(cfg, m, b, cfg["model"].get("precision", "bf16"))
    dense_ar = all_reduce_s(params * 4, N, G, mode, L)
    dense_part = max(dense, dense_ar) if cfg.get("overlap_dense_allreduce", True) else dense + dense_ar
    over = rates.get("step_overhead_us", 0) * 1e-6
    er = embedding_rates(cfg)
    if er:  # fitted: the planner-structured terms (local passes, groups, collectives) at the fitted rates
        t = embedding_terms(cfg, placement, mode, N, G, b)
        comm = t["comm"] * er["comm_scale"] + t["reduce"] + 1e-6 * t["collectives"] * er["collective_us"]
        fwd = t["local_GB"] / er["hbm_GBps"]
        bwd = 1e-6 * (t["groups"] * er["group_us"] + t["round_trips"] * er.get("round_trip_us", 0.0))
    total = fwd + bwd + comm + dense_part + over
    mem = memory_per_gpu(cfg, placement, W)
    fits = mem <= cfg.get("gpu_memory_GB", 80) * 1e9 * cfg.get("memory_fraction", 0.8)
    return {"placement": placement, "comm_mode": mode, "nodes": N, "gpus_per_node": G, "gpus": W,
            "batch_per_gpu": b, "global_batch": b * W, "ms_embedding": 1e3 * (fwd + bwd), "ms_comm": 1e3 * comm,
            "ms_dense": 1e3 * dense, "ms_dense_allreduce": 1e3 * dense_ar, "ms_step": 1e3 * total,
            "samples_per_s": b * W / total, "memory_GB_per_gpu": mem / 1e9, "fits": fits,
            "comm_bytes_per_rank": sum(S for _, S in colls)}


def choose(preds):
    ok = [p for p in preds if p["fits"]]
    return min(ok, key=lambda p: p["ms_step"]) if ok else None


# ---------------------------------------------------------------------------------------------------------
# Measured JSON lines


def read_jsonl(paths):
    rows = []
    for path in paths:
        try:
            with open(path) as f:
                for n, line in enumerate(f, 1):
                    if line.strip():
                        try:
                            rows.append(json.loads(line))
                        except json.JSONDecodeError as e:
                            fail(f"{path}:{n}: not a JSON object ({e})")
        except OSError as e:
            fail(f"{path}: cannot read ({e.strerror})")
    return rows


def embedding_bytes(r):
    """(forward bytes, backward bytes) of a bench_embedding record: the counts the model uses."""
    d, nnz = r["dim"], r["nnz"]
    bags = r["batch"] * r["slots"]
    return (nnz * d * 4 + bags * d * 4), (2 * nnz * d * 4 + bags * d * 4)


def calibrate(cfg, rows):
    rates = dict(cfg["rates"])
    links = dict(cfg["links"])
    notes = []
    fwd = [r for r in rows if r.get("bench") == "embedding" and r.get("mode") in ("eval", "train") and "GBps" in r]
    if fwd:
        top = max(r["batch"] for r in fwd)
        rates["lookup_GBps"] = statistics.median(r["GBps"] for r in fwd if r["batch"] == top)
        notes.append(f"lookup {rates['lookup_GBps']:.1f} GB/s ({len(fwd)} bench_embedding records, batch {top})")
    st = [r for r in rows if r.get("bench") == "embedding_step" and r.get("backward_update_ms")]
    if st:
        rates["backward_GBps"] = statistics.median(embedding_bytes(r)[1] / (r["backward_update_ms"] * 1e-3) / 1e9
                                                   for r in st)
        notes.append(f"backward {rates['backward_GBps']:.1f} GB/s ({len(st)} embedding_step records)")
    dn = [r["dense_TFLOPs"] for r in rows if isinstance(r.get("dense_TFLOPs"), (int, float))]
    if dn:
        rates["dense_TFLOPs"] = statistics.median(dn)
        notes.append(f"dense {rates['dense_TFLOPs']:.1f} TFLOP/s ({len(dn)} records)")
    a2a = [r for r in rows if r.get("bench") == "bench_alltoall" and r.get("op") == "alltoall"
           and r.get("mode") == "nccl" and r.get("nodes", 1) == 1 and r.get("ranks", 1) > 1]
    if a2a:
        links["nvlink_GBps"] = max(r["busbw_GBps"] for r in a2a)
        links["nvlink_latency_us"] = min(r["time_us"] for r in a2a)
        notes.append(f"NVLink {links['nvlink_GBps']:.1f} GB/s, latency {links['nvlink_latency_us']:.1f} us "
                     f"({len(a2a)} nccl all-to-all records)")
    # the link between nodes (real or emulated with --ranks-per-node): all-to-all records across nodes, the
    # median bus bandwidth of the sizes from 4 MB (below, the latency dominates) and the smallest time
    ib = [r for r in rows if r.get("bench") == "bench_alltoall" and r.get("op") == "alltoall"
          and r.get("mode") in ("hier", "mpi") and int(r.get("nodes", 1)) > 1]
    if ib:
        big = [r["busbw_GBps"] for r in ib if r.get("bytes_per_rank", 0) >= (4 << 20)] or [r["busbw_GBps"] for r in ib]
        links["ib_Gbps_per_gpu"] = statistics.median(big) * 8
        links["ib_efficiency"] = 1.0
        links["ib_latency_us"] = min(r["time_us"] for r in ib)
        # Nodes emulated on one host (--ranks-per-node): the "link" is MPI's shared-memory transport through that
        # host's memory, which a rank's sends and receives share (half duplex); the all-to-all records, which send
        # and receive as much, give its bus bandwidth with both directions busy.
        hosts = {h for r in ib for h in (r.get("hosts") or [])}
        links["inter_duplex"] = "half" if len(hosts) == 1 else "full"
        notes.append(f"between nodes {statistics.median(big):.2f} GB/s, latency {links['ib_latency_us']:.1f} us "
                     f"({len(ib)} all-to-all records across nodes"
                     + (f", all on host {next(iter(hosts))}: emulated nodes, half duplex" if len(hosts) == 1 else "")
                     + ")")
    red = [r for r in rows if r.get("bench") == "bench_alltoall" and r.get("op") == "allreduce"
           and r.get("mode") in ("hier", "mpi") and int(r.get("nodes", 1)) > 1]
    if red:  # the bandwidth-bound regime: the largest size measured
        top = max(red, key=lambda r: r.get("bytes_per_rank", 0))
        links["ib_reduce_Gbps"] = top["busbw_GBps"] * 8
        # With one rank per node the record is MPI's all-reduce alone: its rate at each size, net of the latency
        # (mpi_all_reduce_s adds it back), so that the model gives each record's time at its size
        curve = {}
        for r in red:
            if int(r.get("ranks_per_node") or 0) != 1 or r.get("bytes_per_rank", 0) <= 0:
                continue
            N, S = int(r["nodes"]), r["bytes_per_rank"]
            t = r["time_us"] - links["ib_latency_us"]
            t = t if t > 0.1 * r["time_us"] else r["time_us"]
            curve.setdefault(S, []).append(2 * (N - 1) / N * S / (t * 1e-6) / 1e9)
        if curve:
            links["ib_reduce_curve"] = [[S, statistics.median(v)] for S, v in sorted(curve.items())]
        notes.append(f"reductions between nodes {top['busbw_GBps']:.2f} GB/s (all-reduce of "
                     f"{top.get('bytes_per_rank', 0) >> 20} MB, the largest of {len(red)} records)"
                     + (f"; their rate at each of {len(curve)} sizes, "
                        + ", ".join(f"{S / 2**20:g} MB {statistics.median(v):.2f}" for S, v in sorted(curve.items()))
                        + " GB/s" if curve else ""))
    out = dict(cfg, rates=rates, links=links)
    return out, notes


# ---------------------------------------------------------------------------------------------------------
# Measured steps: bench_collection (the embedding collection's forward + backward) and bench_train (the whole
# training step, split into data, embedding, dense and comm). Each record names its own shapes; the embedding
# part is embedding_terms at the rates fit_params fits (--fit), the dense part fitted per (model, precision).


def _ints(text):
    return [int(x) for x in re.findall(r"\d+", text)]


def record_shape(cfg, r):
    """(config with the record's tables, placement, N, G, b, kind) of a bench_collection or bench_train record, or
    None when the record is not one the model predicts."""
    bench = r.get("bench")
    if bench not in ("collection", "train") or not (r.get("ms_step") or r.get("step_ms")):
        return None
    placement = r.get("placement")
    if placement == "plan" and r.get("plan"):  # the planner's plan: predicted when every table has one placement
        kinds = {t.split(":")[1] for t in r["plan"].split() if t.count(":") >= 1}
        placement = kinds.pop() if len(kinds) == 1 else None
    if placement not in PLACEMENTS:
        return None
    W = int(r.get("ranks", 1))
    N = int(r.get("nodes", 1))
    G = int(r.get("ranks_per_node") or max(1, W // max(N, 1)))
    m = dict(cfg["model"])
    if bench == "collection":
        rows, hot = r.get("rows"), r.get("hotness")
        if not rows or not hot:
            return None
        dims = r.get("dims") or [r.get("dim", m["dim"])]
        m.update(cardinalities=list(rows), hotness=list(hot), max_rows=0, dim=statistics.mean(dims),
                 key_alpha=r.get("alpha", 0.0), index=r.get("index", "hashed"))
        owners = [int(t.split(":")[2]) for t in str(r.get("plan", "")).split() if t.count(":") == 2
                  and t.split(":")[1] == "localized" and t.split(":")[2].isdigit()]
        if owners:
            m["owners"] = owners
        b = r.get("batch") or r["global_batch"] / W
    else:
        if r.get("rows"):
            m.update(cardinalities=list(r["rows"]), max_rows=0)
        elif r.get("max_rows"):
            m["max_rows"] = r["max_rows"]
        if r.get("mean_hotness"):
            m["hotness"] = list(r["mean_hotness"])
        else:
            h = [float(x) for x in str(r.get("hotness", "1")).split("-")]
            m["hotness"] = [statistics.mean(h)] * len(m["cardinalities"])
        if r.get("key_alpha"):
            m["key_alpha"] = statistics.mean(r["key_alpha"])
        m["dim"] = r.get("embedding_dim", m["dim"])
        shape = r.get("model_shape", "")
        bottom = re.search(r"bottom MLP ([\d-]+)", shape)
        top = re.search(r"top MLP ([\d-]+)", shape)
        if bottom and top:
            bw, tw = _ints(bottom.group(1)), _ints(top.group(1))
            m.update(dense_features=bw[0], bottom_mlp=bw[1:], top_mlp=tw[1:], top_input=tw[0])
        cross = re.search(r"cross network (\d+) x rank (\d+)", shape)
        if cross:
            m.update(cross_layers=int(cross.group(1)), cross_rank=int(cross.group(2)))
        b = r.get("batch_per_rank") or r["global_batch"] / W
        m["dense_model"] = r.get("model", "dot")
    if len(m["cardinalities"]) != len(m["hotness"]):
        m["hotness"] = [statistics.mean(m["hotness"])] * len(m["cardinalities"])
    opt = r.get("optimizer") or r.get("sparse_optimizer") or ("adagrad" if bench == "train" else "sgd")
    m["optimizer_state_per_value"] = OPTIMIZER_STATE.get(opt, 1)
    c = dict(cfg, model=m)
    if bench == "collection":
        c["hybrid_hot_rows"] = r.get("hot_rows", 1024)  # the collection's default hot set
        m["new_rows_per_rank"] = new_rows_per_rank(r, m, placement, W, b)
    return c, placement, N, G, b, bench


def new_rows_per_rank(r, m, placement, W, b):
    """Rows a rank's hash tables inserted per timed step of a bench_collection record: its new_rows_per_step (all
    ranks) over W; records from before it (no "prefill" field) filled their hashed tables during the steps, so the
    expected new keys of the median timed step (uniform or power-law keys in [0, rows), the global batch's draws per
    step), every copy inserting them under replicated. 0 for a direct index."""
    if "new_rows_per_step" in r:
        return r["new_rows_per_step"] / W
    if "prefill" in r or m.get("index", "hashed") != "hashed":
        return 0.0
    step = r.get("warmup", 5) + (r.get("iters", 20) - 1) / 2  # steps before the median timed one
    alpha = m.get("key_alpha", 0.0) or 0.0
    new = 0.0
    for R, h in zip(m["cardinalities"], m["hotness"]):
        draws = W * b * h
        new += expected_distinct(R, (step + 1) * draws, alpha) - expected_distinct(R, step * draws, alpha)
    return new * (W if placement == "replicated" else 1) / W


OPTIMIZER_STATE = {"sgd": 0, "momentum": 1, "adagrad": 1, "adam": 2, "lazy_adam": 2}


def comm_mode_of(r):
    return "hier" if r.get("comm_mode", r.get("mode")) == "hier" else "nccl"


def embedding_variable_ms(cfg, placement, mode, N, G, b):
    """The model's embedding time of one step (lookups + backward + their collectives), ms, before the fit."""
    L = link(cfg)
    colls, (keys, bags) = collectives(cfg, placement, b, N, G)
    fwd, bwd = lookup_s(cfg, keys, bags, cfg["rates"])
    comm = sum(COLLECTIVES[c](S, N, G, mode, L) for c, S in colls)
    return 1e3 * (fwd + bwd + comm)


def dense_flops(m, b):
    """Forward + backward flops of the dense part of b samples, and its parameter count."""
    flops, params = dense_flops_per_sample(m)
    return b * flops, params


def data_bytes(m, b):
    """Host-to-device bytes of b samples: label and dense floats, keys and offsets."""
    return b * (4 * (1 + m["dense_features"]) + 8 * (sum(m["hotness"]) + len(m["cardinalities"])))


def measured_parts(r):
    """The record's embedding time and the rest of its step (ms)."""
    if r.get("bench") == "collection":
        return r.get("ms_step") or r.get("step_ms"), 0.0
    return r.get("ms_embedding"), None


def dense_key(m, prec):
    return f"{m.get('dense_model', 'dot')}/{prec}"


def dense_ms(cfg, m, b, prec):
    """The dense part's forward + backward of b samples (ms). Fitted per (model, precision) as ms per sample: the
    models differ in more than FLOPs (DCNv2's cross network is bound by memory traffic, not the tensor cores).
    A pair without a measurement: the same model at the other precision times the ratio of the two precisions
    on a model measured at both; else FLOPs at the precision's fitted (or the config's) TFLOP/s."""
    fit = cfg.get("fit", {})
    per = fit.get("dense_ms_per_sample", {})
    key = dense_key(m, prec)
    if key in per:
        return per[key] * b
    model = m.get("dense_model", "dot")
    for other in sorted({k.split("/")[1] for k in per} - {prec}):
        if f"{model}/{other}" in per:
            ratios = [per[f"{x}/{prec}"] / per[f"{x}/{other}"] for x in {k.split("/")[0] for k in per}
                      if f"{x}/{prec}" in per and f"{x}/{other}" in per]
            if ratios:
                return per[f"{model}/{other}"] * statistics.median(ratios) * b
    flops, _ = dense_flops(m, b)
    tf = fit.get("dense_TFLOPs", {}).get(prec) or cfg["rates"]["dense_TFLOPs"]
    return 1e3 * flops / (tf * 1e12)


def embedding_rates(cfg):
    """The fitted rates of the embedding terms, or None before a fit."""
    return cfg.get("fit", {}).get("embedding_rates")


def predict_record(cfg, r):
    """(description, measured ms_step, predicted ms_step, parts) of a collection or train record, or None."""
    shape = record_shape(cfg, r)
    if not shape:
        return None
    c, placement, N, G, b, bench = shape
    mode = comm_mode_of(r)
    fit = cfg.get("fit", {})
    rates = embedding_rates(cfg)
    if rates:
        scale = fit.get("train_embedding_scale", 1.0) if bench == "train" else 1.0
        emb = embedding_ms(embedding_terms(c, placement, mode, N, G, b), rates, scale)
    else:
        emb = embedding_variable_ms(c, placement, mode, N, G, b)
    parts = {"ms_embedding": emb}
    if rates and bench == "train" and r.get("route_ahead") and placement == "dispatch" and N * G > 1:
        # routed during the step before, beside its dense layers (assumed hidden there: they are longer)
        parts["ms_route_ahead"] = -embedding_ms(dispatch_route_terms(c, mode, N, G, b), rates, scale)
    W = N * G
    if bench == "train":
        m = c["model"]
        _, params = dense_flops(m, b)
        parts["ms_dense"] = dense_ms(cfg, m, b, r.get("precision", "fp32"))
        parts["ms_comm"] = 1e3 * all_reduce_s(params * 4, N, G, mode, link(c)) + (fit.get("comm_fixed_ms", 0.0) if W > 1 else 0.0)
        parts["ms_data"] = 1e3 * data_bytes(m, b) / (fit.get("data_GBps", 25.0) * 1e9)
    total = sum(parts.values())
    if bench == "train" and r.get("batch_copy") == "staged":
        # the batch copied on its own stream while the step before trains: it costs only where it is longer
        rest = total - parts["ms_data"]
        total = max(rest, parts["ms_data"])
    meas = r.get("ms_step") or r.get("step_ms")
    what = r.get("tables") or f"{r.get('model', '')} {r.get('precision', '')}".strip()
    desc = f"{bench} {what} {placement} {mode} {W}r/{N}n b={b:g}"
    return desc, meas, total, parts


def fit_params(cfg, rows):
    """The fitted part of the config from collection and train records:
    - embedding_rates: comm_scale, hbm_GBps, collective_us, group_us over embedding_terms (non-negative least
      squares on relative error) on the bench_collection steps (without any: the train records' ms_embedding);
    - train_embedding_scale: the training step's embedding phase over the collection's model of it, the links'
      time left out of both (median);
    - dense_ms_per_sample per (model, precision), and dense TFLOP/s per precision (the fallback; medians);
    - data_GBps (train records' ms_data) and comm_fixed_ms (the dense all-reduce's fixed cost on more than one
      rank: median of ms_comm minus the model's)."""
    coll, train, dense, tflops, data, comm = [], [], {}, {}, [], []
    for r in rows:
        shape = record_shape(cfg, r)
        if not shape:
            continue
        c, placement, N, G, b, bench = shape
        terms = embedding_terms(c, placement, comm_mode_of(r), N, G, b)
        if bench == "collection":
            coll.append((terms, r.get("ms_step") or r.get("step_ms")))
            continue
        if r.get("ms_embedding"):
            train.append((terms, r["ms_embedding"]))
        m = c["model"]
        flops, params = dense_flops(m, b)
        if r.get("ms_dense"):
            prec = r.get("precision", "fp32")
            dense.setdefault(dense_key(m, prec), []).append(r["ms_dense"] / b)
            tflops.setdefault(prec, []).append(flops / (r["ms_dense"] * 1e-3) / 1e12)
        if r.get("ms_data"):
            data.append(data_bytes(m, b) / (r["ms_data"] * 1e-3) / 1e9)
        if N * G > 1 and r.get("ms_comm") is not None:
            comm.append(max(0.0, r["ms_comm"] - 1e3 * all_reduce_s(params * 4, N, G, comm_mode_of(r), link(c))))
    out = {}
    pts = [(t, y) for t, y in (coll or train) if y and y > 0]
    if pts:
        # the host round trips at their fixed cost (not fitted: a few per step, tens of us, which 12 points cannot
        # tell from the other fixed costs); the rest fitted
        ru = cfg.get("host_round_trip_us", HOST_ROUND_TRIP_US)
        X = [[1e3 * t["comm"], 1e3 * t["local_GB"], 1e-3 * t["collectives"], 1e-3 * t["groups"],
              1e-6 * t.get("new_rows", 0.0)] for t, _ in pts]
        a, h, cu, gu, nr = nnls_relative(X, [y for _, y in pts],
                                         [1e-3 * ru * t["round_trips"] + 1e3 * t["reduce"] for t, _ in pts])
        # a: ms per ms of link time; h: s per GB (1 / GB/s); cu, gu: us; nr: ns per new row
        out["embedding_rates"] = {"comm_scale": a, "hbm_GBps": 1 / h if h > 0 else 1e9, "collective_us": cu,
                                  "group_us": gu, "round_trip_us": ru, "new_row_ns": nr, "points": len(pts),
                                  "from": "collection" if coll else "train"}
        if coll and train:
            er = out["embedding_rates"]
            out["train_embedding_scale"] = statistics.median(
                (y - link_ms(t, er)) / (embedding_ms(t, er) - link_ms(t, er)) for t, y in train
                if embedding_ms(t, er) > link_ms(t, er))
    if dense:
        out["dense_ms_per_sample"] = {k: statistics.median(v) for k, v in dense.items()}
        out["dense_TFLOPs"] = {k: statistics.median(v) for k, v in tflops.items()}
    if data:
        out["data_GBps"] = statistics.median(data)
    if comm:
        out["comm_fixed_ms"] = statistics.median(comm)
    return out



def fit(cfg, rows, sources=()):
    """cfg with "fit" from the records (see fit_params) and where it came from."""
    params = fit_params(cfg, rows)
    revs = sorted({str(r.get("git")) for r in rows if record_shape(cfg, r) and r.get("git")})
    hosts = sorted({g for r in rows if record_shape(cfg, r) for g in (r.get("gpus") or [r.get("backend", "?")])})
    params["source"] = {"files": list(sources), "revisions": revs, "devices": hosts,
                        "records": sum(1 for r in rows if record_shape(cfg, r))}
    return dict(cfg, fit=params)


def check(cfg, rows, loo=False):
    """[(description, measured, predicted, unit)] for every record the model can predict. loo: each collection
    or train record is predicted by a fit of cfg on every other record (leave one out)."""
    L = link(cfg)
    out = []
    steps = [r for r in rows if record_shape(cfg, r)]
    for r in rows:
        bench = r.get("bench")
        if bench == "bench_alltoall" and r.get("op") in COLLECTIVES:
            W, N = int(r.get("ranks", 1)), int(r.get("nodes", 1))
            G = int(r.get("ranks_per_node") or max(1, W // max(N, 1)))
            mode = "hier" if r.get("mode") == "hier" else "nccl"
            pred = COLLECTIVES[r["op"]](r["bytes_per_rank"], N, G, mode, L) * 1e6
            out.append((f"{r['op']} {r.get('mode')} {W} ranks/{N} node(s) {r['bytes_per_rank']} B", r["time_us"],
                        pred, "us"))
        elif bench == "embedding" and "ms" in r:
            f, _ = embedding_bytes(r)
            out.append((f"lookup {r.get('mode')} dim {r['dim']} batch {r['batch']} hot {r['hot']} alpha {r.get('alpha')}",
                        r["ms"], f / (cfg["rates"]["lookup_GBps"] * 1e9) * 1e3, "ms"))
        elif bench == "embedding_step" and "step_ms" in r:
            f, b = embedding_bytes(r)
            pred = (f / cfg["rates"]["lookup_GBps"] + b / cfg["rates"]["backward_GBps"]) / 1e9 * 1e3
            out.append((f"embedding step dim {r['dim']} batch {r['batch']} hot {r['hot']} alpha {r.get('alpha')}",
                        r["step_ms"], pred, "ms"))
        elif record_shape(cfg, r):
            c = fit(cfg, [q for q in steps if q is not r]) if loo else cfg
            p = predict_record(c, r)
            if p:
                out.append((p[0], p[1], p[2], "ms"))
        elif r.get("placement") in PLACEMENTS and (r.get("step_ms") or r.get("ms_step")):
            W, N = int(r.get("ranks", 1)), int(r.get("nodes", 1))
            G = int(r.get("ranks_per_node") or max(1, W // max(N, 1)))
            gb = r.get("global_batch") or r.get("batch")
            if not gb:
                continue
            p = predict(cfg, r["placement"], comm_mode_of(r), N, G, gb / W)
            out.append((f"step {r['placement']} {comm_mode_of(r)} {W} ranks/{N} node(s) global batch {gb}",
                        r.get("step_ms") or r.get("ms_step"), p["ms_step"], "ms"))
    return out


# ---------------------------------------------------------------------------------------------------------


def plot(path, results, chosen, title):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.8))
    colors = {}
    for pl in PLACEMENTS:
        for mode, ls in (("nccl", "--"), ("hier", "-")):
            pts = sorted((p["gpus"], p) for p in results if p["placement"] == pl and p["comm_mode"] == mode)
            if not pts:
                continue
            xs = [g for g, _ in pts]
            kw = {"color": colors[pl]} if pl in colors else {}
            line, = ax1.plot(xs, [p["ms_step"] for _, p in pts], ls=ls, marker=".", label=f"{pl} ({mode})", **kw)
            colors.setdefault(pl, line.get_color())
            ax2.plot(xs, [p["samples_per_s"] / 1e6 for _, p in pts], ls=ls, marker=".", color=colors[pl])
            bad = [(g, p) for g, p in pts if not p["fits"]]
            ax1.plot([g for g, _ in bad], [p["ms_step"] for _, p in bad], "x", color="k", ms=7)
    for c in chosen:
        ax1.plot(c["gpus"], c["ms_step"], "o", mfc="none", mec="k", ms=11)
    for ax in (ax1, ax2):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("GPUs (nodes x GPUs per node)")
        ax.grid(True, alpha=0.3)
    ax1.set_yscale("log")
    ax1.set_ylabel("predicted step time (ms)")
    ax2.set_ylabel("predicted throughput (M samples/s)")
    ax1.set_title("solid: hier, dashed: nccl flat; circle: planner's choice; x: does not fit", fontsize=9)
    ax1.legend(fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}")


def main(argv=None):
    here = os.path.dirname(os.path.abspath(__file__))
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=os.path.join(here, "scaling_model.json"))
    p.add_argument("--model", default="default", help="a variant of the config's models (default: model)")
    p.add_argument("--nodes", help="comma-separated node counts (default: the config's sizes)")
    p.add_argument("--gpus-per-node", type=int, help="default: the config's sizes")
    p.add_argument("--batch-per-gpu", type=float, help="default: the config's model.batch_per_gpu (weak scaling)")
    p.add_argument("--global-batch", type=float, help="strong scaling: this global batch at every size")
    p.add_argument("--calibrate", nargs="+", default=[], metavar="JSONL", help="measured rates from JSON lines")
    p.add_argument("--fit", nargs="+", default=[], metavar="JSONL",
                   help="fit the per-placement embedding scale and fixed cost, dense TFLOP/s, data GB/s and the "
                        "dense all-reduce's fixed cost from bench_collection / bench_train lines")
    p.add_argument("--write-config", metavar="JSON", help="with --fit/--calibrate: write the fitted config here")
    p.add_argument("--check", nargs="+", default=[], metavar="JSONL", help="compare with measured JSON lines")
    p.add_argument("--loo", action="store_true",
                   help="--check: predict each collection/train record from a fit (--fit's files) without it")
    p.add_argument("--out", help="predictions as JSON lines")
    p.add_argument("--plot", help="PNG of predicted step time and throughput against GPUs")
    a = p.parse_args(argv)
    cfg = load_config(a.config, a.model)
    if a.calibrate:
        cfg, notes = calibrate(cfg, read_jsonl(a.calibrate))
        print("calibrated: " + ("; ".join(notes) if notes else "no usable record: the config's rates stay"))
    if a.fit:
        fit_rows = read_jsonl(a.fit)
        cfg = fit(cfg, fit_rows, a.fit)
        f = cfg["fit"]
        print(f"fitted from {f['source']['records']} record(s) of {', '.join(a.fit)} "
              f"(revisions {', '.join(f['source']['revisions']) or 'unknown'}):")
        e = f.get("embedding_rates")
        if e:
            print(f"  embedding ({e['points']} {e['from']} point(s)): links' time x {e['comm_scale']:.4g}, local "
                  f"{e['hbm_GBps']:.4g} GB/s, {e['collective_us']:.4g} us per collective, {e['group_us']:.4g} us "
                  f"per group ({e.get('round_trip_us', 0):.4g} us per host round trip, fixed)")
        for k in ("train_embedding_scale", "dense_ms_per_sample", "dense_TFLOPs", "data_GBps", "comm_fixed_ms"):
            if k in f:
                print(f"  {k} {f[k]}")
    if a.write_config:
        with open(a.write_config, "w") as out:
            json.dump(cfg, out, indent=1)
            out.write("\n")
        print(f"wrote {a.write_config}")
    if a.check:
        measured = read_jsonl(a.check)
        if a.loo:
            if not a.fit:
                fail("--loo refits without each point: it needs --fit FILES")
            base = load_config(a.config, a.model)
            base = calibrate(base, read_jsonl(a.calibrate))[0] if a.calibrate else base
            rows = check(base, measured, loo=True)
        else:
            rows = check(cfg, measured)
        if not rows:
            fail(f"no record in {', '.join(a.check)} that the model predicts (bench_alltoall, bench_embedding, "
                 f"or a record with placement and step_ms)")
        print(f"{'point':<64} {'measured':>11} {'predicted':>11} {'error':>8}"
              + ("   (leave one out)" if a.loo else ""))
        errs = []
        for desc, meas, pred, unit in rows:
            err = (pred - meas) / meas * 100 if meas else float("inf")
            errs.append(abs(err))
            print(f"{desc:<64} {meas:>9.4g}{unit:>2} {pred:>9.4g}{unit:>2} {err:>7.1f}%")
        print(f"check: {len(rows)} point(s), mean |error| {statistics.mean(errs):.1f}%, max {max(errs):.1f}%")
        steps = [e for (desc, _, _, _), e in zip(rows, errs) if desc.startswith(("collection ", "train "))]
        if steps:
            print(f"collection/train steps: {len(steps)} point(s), mean |error| {statistics.mean(steps):.1f}%, "
                  f"max {max(steps):.1f}%, {sum(1 for e in steps if e <= 20)} within 20%"
                  + (" (leave one out)" if a.loo else ""))
        return 0
    sizes = cfg.get("sizes", {})
    nodes = [int(x) for x in a.nodes.split(",")] if a.nodes else sizes.get("nodes", [1])
    G = a.gpus_per_node or sizes.get("gpus_per_node", 8)
    results, chosen = [], []
    m = cfg["model"]
    print(f"# {m['name']}: {len(m['cardinalities'])} tables, dim {m['dim']}, hotness sum {sum(m['hotness'])}, "
          f"rows capped at {m.get('max_rows')}; lookup {cfg['rates']['lookup_GBps']:.0f} GB/s, backward "
          f"{cfg['rates']['backward_GBps']:.0f} GB/s, dense {cfg['rates']['dense_TFLOPs']:.0f} TFLOP/s; NVLink "
          f"{cfg['links']['nvlink_GBps']:.0f} GB/s, IB {cfg['links']['ib_Gbps_per_gpu']} Gb/s per GPU")
    print(f"# {'nodes':>5} {'gpus':>5} {'batch/gpu':>9} " + " ".join(f"{pl[:11]:>11}" for pl in cfg["placements"])
          + "  choice (ms per step, best comm mode; * does not fit)")
    for N in nodes:
        W = N * G
        b = a.global_batch / W if a.global_batch else (a.batch_per_gpu or m["batch_per_gpu"])
        preds = [predict(cfg, pl, mode, N, G, b) for pl in cfg["placements"] for mode in cfg["comm_modes"]]
        results += preds
        best = choose(preds)
        chosen += [best] if best else []
        cells = []
        for pl in cfg["placements"]:
            bp = min((q for q in preds if q["placement"] == pl), key=lambda q: q["ms_step"])
            cells.append(f"{bp['ms_step']:>10.3f}{'' if bp['fits'] else '*'}" + (" " if bp["fits"] else ""))
        pick = f"{best['placement']} ({best['comm_mode']}) {best['samples_per_s'] / 1e6:.2f} M samples/s" if best \
            else "nothing fits"
        print(f"  {N:>5} {W:>5} {b:>9.0f} " + " ".join(cells) + f"  {pick}")
    if a.out:
        with open(a.out, "w") as f:
            for r in results:
                f.write(json.dumps(dict(r, chosen=any(r is c for c in chosen), model=m["name"])) + "\n")
        print(f"wrote {a.out}")
    if a.plot:
        plot(a.plot, results, chosen, f"{m['name']}: predicted, {G} GPUs per node")
    return 0


if __name__ == "__main__":
    sys.exit(main())
