#!/usr/bin/env python3
"""One GPU visit's records into the project's current results: experiments/RESULTS.md, the measured files and the
figures, all from one revision.

    experiments/make_results.py OUT [--repo .] [--peak-tflops 790]

OUT is the folder `experiments/gpu_session.sh BUNDLE OUT` wrote: JSON lines of sparta's benchmarks (bench.jsonl)
and of the peers in the same call (peers.jsonl), and the test log (tests.log). This script
- names the visit <machine>_<revision> (machine: the GPU model and how many GPUs the visit used, e.g. h200x2;
  revision: the bundle's, seven hex digits) and refuses records of another revision;
- moves what experiments/measured/ held before into experiments/measured/archive/, then writes the visit's
  records there as <machine>_<revision>_<part>.jsonl (train, embedding, collection, comm, peers; every peer line
  stamped with the revision), the test summary as <machine>_<revision>_tests.txt and the profile part's
  summaries and timelines (*_ncu.txt, *_trace.txt) under their names;
- draws the figures into plots/figures/ with the plots/ scripts;
- writes experiments/RESULTS.md: each table's command, its peer and the ratio against it.
Exit status 1 when OUT holds no records, 2 on a revision mismatch.
"""
import argparse
import collections
import glob
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

DCNV2_HOTNESS = "3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1"
PARTS = {"train": ("train",), "embedding": ("embedding", "embedding_step", "embedding_floor", "hashtable"),
         "collection": ("collection",), "comm": ("alltoall", "bench_alltoall")}


def read_records(out):
    recs = []
    for path in sorted(glob.glob(os.path.join(out, "*.jsonl"))):
        for n, line in enumerate(open(path), 1):
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                recs.append(json.loads(line))
            except json.JSONDecodeError as e:
                sys.exit(f"make_results: {path}:{n}: not JSON ({e})")
    return recs


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def fmt(x, digits=2):
    if x is None:
        return "–"
    if abs(x) >= 1e5:
        return f"{x / 1e6:.{digits}f} M"
    return f"{x:.{digits}f}"


def ratio(ours_time=None, peer_time=None, ours_rate=None, peer_rate=None):
    if ours_time and peer_time:
        return f"**{peer_time / ours_time:.2f}x**"
    if ours_rate and peer_rate:
        return f"**{ours_rate / peer_rate:.2f}x**"
    return "–"


def dense_tflop(rec):
    """The dense part's TFLOP a step (forward and backward: 3x the forward's GEMMs), from the record's model_shape
    ("dot, bottom MLP 13-512-256-128, 26 x 128 embeddings, top MLP 479-...-1, ...", dcnv2 with "N cross layers of
    rank R")."""
    shape = rec.get("model_shape", "")
    nums = lambda key: [int(x) for x in re.search(key + r" ([0-9-]+)", shape).group(1).split("-")]
    try:
        bottom, top = nums("bottom MLP"), nums("top MLP")
        slots, dim = map(int, re.search(r"(\d+) x (\d+) embeddings", shape).groups())
    except AttributeError:
        return None
    macs = sum(a * b for a, b in zip(bottom, bottom[1:])) + sum(a * b for a, b in zip(top, top[1:]))
    if rec.get("model") == "dot":
        f = slots + 1
        macs += f * f * dim  # the pairwise dots as one batched GEMM
    else:
        m = re.search(r"(\d+) cross layers?\D+(\d+)", shape)
        layers, rank = (int(m.group(1)), int(m.group(2))) if m else (3, 512)
        width = (slots + 1) * dim
        macs += layers * 2 * width * rank
    batch = rec.get("batch_per_rank") or rec.get("batch")
    return 3 * 2 * macs * batch / 1e12


def machine_of(recs):
    gpus = collections.Counter(g for r in recs for g in r.get("gpus", []))
    name = gpus.most_common(1)[0][0] if gpus else "gpu"
    model = re.sub(r"[^a-z0-9]", "", name.lower().replace("nvidia", "").split()[0] if name.split() else "gpu")
    most = max([r.get("ranks", 1) for r in recs if "program" in r] + [1])
    return model + (f"x{most}" if most > 1 else "")


def part_of(rec):
    for part, benches in PARTS.items():
        if rec.get("bench") in benches:
            return part
    return "peers" if "peer" in rec else "other"


def train_records(recs):
    """The records of the training table: bf16, 65536 samples a GPU, fp32 rows in HBM, the 4M cap, no trace or
    variant runs."""
    return [r for r in recs if r.get("bench") == "train" and r.get("precision") == "bf16" and
            r.get("batch_per_rank") == 65536 and r.get("storage", "fp32") == "fp32" and
            r.get("tier", "hbm") == "hbm" and r.get("max_rows", 4000000) == 4000000 and
            not r.get("tag", "").startswith(("trace", "variant", "fullsize"))]


def train_keys(recs):
    """The keys' law of the training table's records against the peers' (uniform random, peer_dlrm.py):
    records without an alpha came from a bench_train that drew the synthetic generator's power law 1.1."""
    alphas = {r.get("alpha") for r in train_records(recs)}
    if alphas == {0}:
        return "uniform keys, as the peers draw them"
    if None in alphas:
        return ("sparta's keys by a power law (alpha 1.1: these records predate `bench_train --alpha` and drew the "
                "synthetic generator's default), the peers' uniform: not the same keys, and skewed keys make the "
                "embeddings cheaper, so these ratios may favour sparta")
    return ("sparta's keys " + ", ".join("uniform" if not a else f"by a power law (alpha {a:g})" for a in sorted(alphas)) +
            ", the peers' uniform")


def train_table(recs, peak):
    rows = ["| model (keys per slot) | index | GPUs | sparta samples/s | step ms | dense ms (share of the bf16 tensor rate) | "
            "PyTorch + FBGEMM TBE, compiled | ratio | PyTorch (EmbeddingBag) | ratio | 2 GPUs over 1 |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    ours = train_records(recs)
    peers = [r for r in recs if r.get("peer", "").startswith("torch.dlrm") and r.get("precision") == "bf16" and
             r.get("batch") == 65536]
    one = {}
    for model in ("dot", "dcnv2"):
        for index in ("direct", "hashed"):
            for n in sorted({r["ranks"] for r in ours if r["model"] == model and r.get("index", "hashed") == index}):
                rs = [r for r in ours if r["model"] == model and r["ranks"] == n and r.get("index", "hashed") == index]
                total = median([r["samples_per_s"] for r in rs])
                ms_dense = median([r.get("ms_dense") for r in rs])
                tf = dense_tflop(rs[0])
                share = f"{ms_dense:.2f} ({tf / (ms_dense / 1e3) / peak * 100:.0f}%)" if ms_dense and tf else "–"
                tbe = median([p["samples_per_s"] for p in peers if p["model"] == model and
                              p["peer"] == "torch.dlrm.tbe.compiled"])
                plain = median([p["samples_per_s"] for p in peers if p["model"] == model and p["peer"] == "torch.dlrm"])
                if n == 1:
                    one[(model, index)] = total
                scale = f"{total / one[(model, index)]:.2f}x" if n > 1 and one.get((model, index)) else ""
                hot = rs[0].get("hotness", "1")
                keys = "one key each" if hot == "1" else ("MLPerf DCNv2" if hot == DCNV2_HOTNESS else hot)
                rows.append(f"| {model} ({keys}) | {index} | {n} | {fmt(total)} | {fmt(median([r['ms_step'] for r in rs]))} | "
                            f"{share} | {fmt(tbe) if n == 1 else ''} | "
                            f"{ratio(ours_rate=total, peer_rate=tbe) if n == 1 else ''} | {fmt(plain) if n == 1 else ''} | "
                            f"{ratio(ours_rate=total, peer_rate=plain) if n == 1 else ''} | {scale} |")
    return rows if len(rows) > 2 else []


def fullsize_table(recs):
    """The full-size MLPerf v1 tables (tag fullsize*): the planner's plan against every fixed placement."""
    rs = [r for r in recs if r.get("bench") == "train" and r.get("tag", "").startswith("fullsize")]
    if not rs:
        return []
    fixed = [r for r in rs if r.get("placement_option") != "auto"]
    best = max(fixed, key=lambda r: r["samples_per_s"]) if fixed else None
    rows = ["| placement asked | placement taken | samples/s | step ms | plan over the best fixed placement |",
            "|---|---|---|---|---|"]
    for r in sorted(rs, key=lambda r: -r["samples_per_s"]):
        vs = f"{r['samples_per_s'] / best['samples_per_s']:.3f}x" if best and r.get("placement_option") == "auto" else ""
        rows.append(f"| {r.get('placement_option')} | {r.get('placement')} | {fmt(r['samples_per_s'])} | "
                    f"{fmt(r['ms_step'])} | {vs} |")
    return rows


def tier_table(recs):
    """Tables in host memory under a GPU cache (tags tier_host, t60_host) against the same tables in HBM (tier_hbm,
    t60_hbm) and against FBGEMM TBE with EmbeddingLocation.MANAGED_CACHING (the peer's records with cache_rows), the
    full MLPerf tables trained with a cache (bench_train, tag full_host), and the eviction points of bench_hashtable
    --evict."""
    coll = [r for r in recs if r.get("bench") == "collection" and r.get("tag", "").startswith(("tier_", "t60_", "t60s_", "steady_"))]
    peers = [p for p in recs if p.get("peer") in ("fbgemm.tbe.collection", "fbgemm.tbe") and p.get("alpha") is not None]
    ev = [r for r in recs if r.get("bench") == "hashtable" and r.get("eviction") in ("lru", "lfu")]
    rows = ["| tables | keys | rows in | sparta step ms | FBGEMM TBE step ms | sparta over FBGEMM | against sparta in HBM | "
            "wrong |", "|---|---|---|---|---|---|---|---|"]

    def pick(tag, alpha, key="ms_step"):
        return median([r[key] for r in coll if r["tag"] == tag and r.get("alpha") == alpha and r.get(key)])

    def b2b(ms):  # " (X back to back)": the steps enqueued one after another, where the records have them
        return f" ({fmt(ms, 3)} back to back)" if ms else ""

    rows60 = next((r["rows"][0] for r in coll if r["tag"].startswith(("t60_", "t60s_"))), None)

    def peer(alpha, cached, big, steady, key=None):
        # the peer's runs that draw a batch a step (--fresh-batches) where there are some, else its one-batch runs;
        # steady: its runs of 2 x (warm-up + timed) batches after 200 warm-up steps (500 for the 60 GB table). Their
        # step (each timed alone), or key's figure (train_step_ms_back_to_back)
        sel = [p for p in peers if p.get("alpha") == alpha and ((p.get("cache_rows") or 0) > 0) == cached and
               p.get("optimizer") == "exact_rowwise_adagrad" and
               (p.get("rows") == rows60 if big else p.get("tables") == "mlperf-v1") and
               (p.get("fresh_batches", 1) > 50) == steady]
        fresh = [p for p in sel if p.get("fresh_batches", 1) > 1]
        return median([p.get(key) if key else p.get("step_ms", p.get("train_step_ms")) for p in (fresh or sel)])

    cases = [("26 MLPerf tables (4M cap), one key a slot, row-wise Adagrad", "tier_", False, (1.1, 0.0)),
             ("the same, after 200 steps (the caches full and evicting)", "steady_", False, (1.1,)),
             ("one table of 116M rows of 128 (60 GB with its state), 26 keys a sample, row-wise Adagrad", "t60_", True,
              (1.1,)),
             ("the same, after 500 steps (about 40M rows drawn: the cache full and evicting)", "t60s_", True, (1.1,))]
    for what, prefix, big, alphas in cases:
        steady = prefix in ("steady_", "t60s_")
        for alpha in alphas:
            hbm, host = pick(prefix + "hbm", alpha), pick(prefix + "host", alpha)
            if hbm is None and host is None:
                continue
            keys = f"power law {alpha:g}" if alpha else "uniform"
            cache = next((r.get("cache_gb") for r in coll if r["tag"] == prefix + "host"), None)
            wrong = sum(r.get("wrong", 0) for r in coll if r["tag"].startswith(prefix) and r.get("alpha") == alpha)
            ph, pc = peer(alpha, False, big, steady), peer(alpha, True, big, steady)
            bb = "train_step_ms_back_to_back"
            rows.append(f"| {what} | {keys} | HBM | {fmt(hbm, 3)}{b2b(pick(prefix + 'hbm', alpha, 'ms_step_back_to_back'))} | "
                        f"{fmt(ph, 3)}{b2b(peer(alpha, False, big, steady, bb))} | "
                        f"{ratio(ours_time=hbm, peer_time=ph) if ph else ''} | | {wrong} |")
            rows.append(f"| the same | {keys} | host memory, a {cache:g} GB cache a table (FBGEMM: MANAGED_CACHING, "
                        f"the same rows cached) | {fmt(host, 3)}{b2b(pick(prefix + 'host', alpha, 'ms_step_back_to_back'))} | "
                        f"{fmt(pc, 3)}{b2b(peer(alpha, True, big, steady, bb))} | "
                        f"{ratio(ours_time=host, peer_time=pc) if pc else ''} | "
                        f"{f'{host / hbm:.2f}x' if host and hbm else ''} | |")
            lfu = pick(prefix + "host_lfu", alpha)
            if lfu:  # the same cache evicting by LFU (the peer's runs evict by its default, LRU)
                rows.append(f"| the same | {keys} | host memory, a {cache:g} GB cache a table, LFU eviction | "
                            f"{fmt(lfu, 3)} | | {ratio(ours_time=lfu, peer_time=pc) + ' (its LRU)' if pc else ''} | "
                            f"{f'{lfu / hbm:.2f}x' if hbm else ''} | |")
            hbm16, host16 = pick(prefix + "hbm_bf16", alpha), pick(prefix + "host_bf16", alpha)
            if host16:  # bf16 rows, as stored in host memory too (the cache's bytes hold about twice the rows)
                rows.append(f"| the same, bf16 rows | {keys} | HBM | {fmt(hbm16, 3)} | {fmt(ph, 3)} (fp32 rows) | "
                            f"{ratio(ours_time=hbm16, peer_time=ph) if ph and hbm16 else ''} | | |")
                rows.append(f"| the same, bf16 rows | {keys} | host memory, a {cache:g} GB cache a table (about twice "
                            f"the rows) | {fmt(host16, 3)} | {fmt(pc, 3)} (fp32 rows) | "
                            f"{ratio(ours_time=host16, peer_time=pc) if pc else ''} | "
                            f"{f'{host16 / hbm16:.2f}x (its HBM)' if hbm16 else ''} | |")
    for r in recs:
        if r.get("bench") == "train" and r.get("tag") == "full_host":
            alpha, k = r.get("alpha", 1.1), r.get("batches", 1)
            law = f"power law {alpha:g}" if alpha else "uniform"
            turn = (f", {k} batches in turn" if k > 1 else
                    ", one batch every step (after the warm-up its keys are all cached: the tier's misses are not timed)")
            rows.append(f"| the full MLPerf v1 tables (40M cap, 188M rows of 128), `bench_train --model dot "
                        f"--max-rows 40000000 --index direct --sparse-optimizer rowwise_adagrad --tier host --cache-gb "
                        f"{r.get('cache_gb'):g}`, one GPU | {law}{turn} | host memory, a {r.get('cache_gb'):g} GB "
                        f"cache a table | {fmt(r['ms_step'], 3)} ({fmt(r['samples_per_s'])} samples/s) | | | | "
                        f"{r.get('wrong', '')} |")
    for r in ev:
        rows.append(f"| bench_hashtable {r['op']} ({r['eviction']}), {r['rows']} cached rows of dim {r['dim']}, "
                    f"{r['keys']} keys a call | a stream of new keys | host memory | {fmt(r['ms'], 3)} a call | "
                    f"{r['Gkeys_per_s'] * 1e3:.2f} M keys/s | {r['inserted']} inserted, {r['evicted']} evicted | | "
                    f"{r['wrong']} |")
    return rows if len(rows) > 2 else []


def variants_table(recs):
    """Switches weighed in the same call: each variant's samples/s against the default's (tag rep*)."""
    rows = ["| model | GPUs | variant | samples/s | default's | default over variant |", "|---|---|---|---|---|---|"]
    train = [r for r in recs if r.get("bench") == "train" and r.get("precision") == "bf16"]
    for v in sorted({r["tag"] for r in train if r.get("tag", "").startswith("variant_")}):
        for model in ("dot", "dcnv2"):
            for n in sorted({r["ranks"] for r in train if r["tag"] == v and r["model"] == model}):
                var = median([r["samples_per_s"] for r in train if r["tag"] == v and r["model"] == model and r["ranks"] == n])
                base = median([r["samples_per_s"] for r in train if r.get("tag", "").startswith("rep") and
                               r["model"] == model and r["ranks"] == n])
                rows.append(f"| {model} | {n} | {v[len('variant_'):]} | {fmt(var)} | {fmt(base)} | "
                            f"{base / var:.3f}x |" if base and var else f"| {model} | {n} | {v} | {fmt(var)} | – | – |")
    return rows if len(rows) > 2 else []


def embedding_table(recs):
    rows = ["| one table of 40M rows, 65536 samples x 26 slots | sparta step ms | FBGEMM TBE step ms | ratio | "
            "sparta forward ms | TBE forward ms |", "|---|---|---|---|---|---|"]
    ours = [r for r in recs if r.get("bench") == "embedding_step" and r.get("alpha", 0) == 0 and r.get("update", "sorted") == "sorted"]
    fwd = [r for r in recs if r.get("bench") == "embedding" and r.get("alpha", 0) == 0 and r.get("out_type", "f32") in ("f32", "fp32")]
    peers = [p for p in recs if p.get("peer") == "fbgemm.tbe" and p.get("alpha", 0) == 0 and p.get("optimizer") == "exact_sgd"]
    seen = set()
    for r in ours:
        key = (r["dim"], str(r.get("hotness", r.get("hot"))), r.get("index"))
        if key in seen:
            continue
        seen.add(key)
        mine = median([x["step_ms"] for x in ours if (x["dim"], str(x.get("hotness", x.get("hot"))), x.get("index")) == key])
        f = median([x.get("ms", x.get("fwd_ms")) for x in fwd if (x.get("dim"), str(x.get("hotness", x.get("hot"))), x.get("index")) == key])
        hot = key[1]
        ps = [p for p in peers if p["dim"] == key[0] and str(p.get("hot")) in (hot, "8" if hot == "8" else hot)]
        pt = median([p["train_step_ms"] for p in ps])
        pf = median([p["fwd_ms"] for p in ps])
        label = {"1": "one-hot", DCNV2_HOTNESS: "MLPerf DCNv2 keys per slot"}.get(hot, f"{hot} keys a slot")
        rows.append(f"| {label}, dim {key[0]}, {key[2]} index, sgd | {fmt(mine, 3)} | {fmt(pt, 3)} | "
                    f"{ratio(ours_time=mine, peer_time=pt)} | {fmt(f, 3)} | {fmt(pf, 3)} |")
    return rows if len(rows) > 2 else []


def tier_record(r):
    """A run of the host-tier table (tier_table), not of the collection's own tables."""
    return r.get("tag", "").startswith(("tier_", "t60_", "t60s_", "steady_"))


def collection_table(recs):
    rows = ["| the 26 MLPerf tables (4M cap), 65536 samples, 1 GPU | optimizer | sparta's rows | sparta step ms (plan) | "
            "FBGEMM TBE fp32 rows | ratio | FBGEMM TBE fp16 rows | ratio |", "|---|---|---|---|---|---|---|---|"]
    ours = [r for r in recs if r.get("bench") == "collection" and r.get("ranks") == 1 and r.get("placement") == "plan"
            and r.get("alpha", 0) == 0 and r.get("batch") == 65536 and not tier_record(r)]
    peers = [p for p in recs if p.get("peer") == "fbgemm.tbe.collection" and p.get("alpha", 0) == 0 and
             not p.get("cache_rows")]
    storage = lambda r: r.get("storage", "fp32")
    for tables in ("mlperf-v1", "dcnv2"):
        for opt in sorted({r.get("optimizer") for r in ours if r.get("tables") == tables}):
            for st in ("fp32", "bf16", "fp16"):
                sel = [r for r in ours if r.get("tables") == tables and r.get("optimizer") == opt and storage(r) == st]
                if not sel:
                    continue
                mine = median([r["ms_step"] for r in sel if r.get("index") == "direct"]) or median([r["ms_step"] for r in sel])
                pt = {w: median([p["step_ms"] for p in peers if p.get("tables") == tables and
                                 p.get("optimizer") == "exact_" + opt and p.get("weights", "fp32") == w])
                      for w in ("fp32", "fp16")}
                keys = "one key per slot" if tables == "mlperf-v1" else "MLPerf DCNv2 keys per slot"
                rows.append(f"| {tables} ({keys}) | {opt} | {st} | {fmt(mine, 3)} | {fmt(pt['fp32'], 3)} | "
                            f"{ratio(ours_time=mine, peer_time=pt['fp32'])} | {fmt(pt['fp16'], 3)} | "
                            f"{ratio(ours_time=mine, peer_time=pt['fp16']) if pt['fp16'] else ''} |")
    return rows if len(rows) > 2 else []


def placement_table(recs):
    ours = [r for r in recs if r.get("bench") == "collection" and r.get("alpha", 0) == 0 and r.get("batch") == 65536
            and not tier_record(r) and r.get("index") == "direct" and r.get("optimizer") in (None, "sgd") and r.get("storage", "fp32") == "fp32"]
    places = ["plan", "replicated", "localized", "dispatch", "distributed", "hybrid"]
    rows = ["| tables | GPUs | " + " | ".join(places) + " |", "|---|---|" + "---|" * len(places)]
    for tables in ("mlperf-v1", "dcnv2"):
        for n in sorted({r["ranks"] for r in ours if r.get("tables") == tables}):
            cells = [fmt(median([r["ms_step"] for r in ours if r.get("tables") == tables and r["ranks"] == n and
                                 r.get("placement") == p]), 2) for p in places]
            rows.append(f"| {tables} | {n} | " + " | ".join(cells) + " |")
    return rows if len(rows) > 2 else []


def comm_table(recs):
    ours = [r for r in recs if r.get("bench") in PARTS["comm"] and r.get("mode") == "nccl" and r.get("ranks", 1) >= 2]
    peers = [p for p in recs if p.get("peer", "").startswith("torch.nccl")]
    rows = ["| operation | bytes per rank | GPUs | sparta µs | NCCL through PyTorch µs | ratio |", "|---|---|---|---|---|---|"]
    for op, peer in (("alltoall", "torch.nccl.all_to_all_single"), ("allreduce", "torch.nccl.all_reduce")):
        for size in (1 << 20, 16 << 20, 64 << 20, 256 << 20):
            mine = median([r.get("time_us") for r in ours if r.get("op") == op and r.get("bytes_per_rank") == size])
            pt = median([p["time_us"] for p in peers if p["peer"] == peer and p.get("bytes_per_rank") == size])
            if mine is None:
                continue
            n = max(r["ranks"] for r in ours if r.get("op") == op)
            rows.append(f"| {op} | {size >> 20} MiB | {n} | {fmt(mine, 1)} | {fmt(pt, 1)} | {ratio(ours_time=mine, peer_time=pt)} |")
    return rows if len(rows) > 2 else []


def tests_summary(out):
    """Every suite's line and each log's closing lines, under the log's name (a visit may rerun suites after a fix,
    in a log of its own)."""
    suites, closing = [], []
    for p in sorted(glob.glob(os.path.join(out, "tests*.log"))):
        lines = open(p, errors="replace").read().splitlines()
        name = os.path.basename(p)
        mine = [l for l in lines if re.match(r"^\S+.*\d+ passed\s+\d+ failed", l)]
        suites += [f"{name}: {l}" for l in mine]
        ends = [f"{name}: {l}" for l in lines if l.startswith("tests: ")]
        if not ends and mine:  # the log stops before run_all's own summary (the call's time limit): its suites' lines summed
            n = [sum(int(re.search(rf"(\d+) {w}", l).group(1)) for l in mine) for w in ("passed", "failed", "skipped")]
            bad = [l.split()[0] for l in mine if not re.search(r" 0 failed", l)]
            ends = [f"{name}: tests: {n[0]} passed, {n[1]} failed, {n[2]} skipped in the {len(mine)} suites it reached "
                    f"before the call's limit" + (f" (failed: {', '.join(bad)})" if bad else "")]
        closing += ends
    return suites, closing


def figures(repo, files, stamp):
    figs = []
    # the python3 with matplotlib: $SPARTA_PYTHON, else Debian's (where make deps installs it), else this one
    py = os.environ.get("SPARTA_PYTHON") or ("/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable)
    plots = os.path.join(repo, "plots")
    out = os.path.join(plots, "figures")
    os.makedirs(out, exist_ok=True)
    for f in glob.glob(os.path.join(out, "*.png")):
        os.remove(f)

    def plot(script, args, name, title):
        png = os.path.join(out, f"{name}_{stamp}.png")
        r = subprocess.run([py, os.path.join(plots, script)] + args + ["--title", title, "--out", png],
                           capture_output=True, text=True)
        if r.returncode == 0:
            figs.append((title, os.path.relpath(png, repo)))
        else:
            print(f"make_results: {script} failed: {r.stderr.strip()[-300:]}", file=sys.stderr)

    if "collection" in files:
        for tables in ("mlperf-v1", "dcnv2"):
            plot("plot_placements.py", [files["collection"], "--where", f"tables={tables}", "--where", "index=direct",
                                        "--where", "batch=65536", "--where", "alpha=0"], f"placements_{tables}",
                 f"embedding collection, {tables} tables: samples/s by placement and GPUs")
    if "train" in files:
        plot("plot_breakdown.py", [files["train"], "--where", "precision=bf16", "--label", "model,ranks"],
             "train_breakdown", "training step: where the time goes (bf16, 65536 samples per GPU)")
    if "comm" in files:
        plot("plot_alltoall.py", [files["comm"], "--where", "mode=nccl"], "alltoall", "collectives: bus bandwidth")
    return figs


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("out")
    p.add_argument("--repo", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    p.add_argument("--peak-tflops", type=float, default=790.0, help="the GPU's bf16 tensor rate (H200: about 790)")
    a = p.parse_args()
    recs = read_records(a.out)
    ours = [r for r in recs if "program" in r]
    if not ours:
        sys.exit(f"make_results: no benchmark records in {a.out}/*.jsonl")
    revs = collections.Counter(r.get("git", "unknown")[:7] for r in ours)
    rev = revs.most_common(1)[0][0]
    if len(revs) > 1:
        print(f"make_results: records of several revisions in {a.out}: {dict(revs)}", file=sys.stderr)
        sys.exit(2)
    dirty = any(r.get("git", "").endswith("-dirty") for r in ours)
    machine = machine_of(ours)
    stamp = f"{machine}_{rev}"
    measured = os.path.join(a.repo, "experiments", "measured")
    archive = os.path.join(measured, "archive")
    os.makedirs(archive, exist_ok=True)
    for f in glob.glob(os.path.join(measured, "*")):
        if os.path.isfile(f) and not os.path.basename(f).startswith(stamp + "_"):
            shutil.move(f, os.path.join(archive, os.path.basename(f)))
    by_part = collections.defaultdict(list)
    for r in recs:
        if "peer" in r and "git" not in r:
            r = dict(r, git=ours[0].get("git"))
        by_part[part_of(r)].append(r)
    files = {}
    for part, rs in by_part.items():
        path = os.path.join(measured, f"{stamp}_{part}.jsonl")
        with open(path, "w") as f:
            for r in rs:
                f.write(json.dumps(r) + "\n")
        files[part] = path
    suites, closing = tests_summary(a.out)
    if suites or closing:
        with open(os.path.join(measured, f"{stamp}_tests.txt"), "w") as f:
            f.write("\n".join(suites + closing) + "\n")
    profiles = []  # gpu_session.sh's profile part: ncu summaries and timelines, kept as they are
    for path in sorted(glob.glob(os.path.join(a.out, "*_ncu.txt")) + glob.glob(os.path.join(a.out, "*_trace.txt"))):
        name = os.path.basename(path)
        if re.fullmatch(r"[a-z0-9_.]+", name):
            shutil.copyfile(path, os.path.join(measured, f"{stamp}_{name}"))
            profiles.append(f"{stamp}_{name}")
    figs = figures(a.repo, files, stamp)

    gpu = ours[0].get("gpus", ["?"])[0]
    date = max(r.get("date", "") for r in ours)[:10]
    rel = lambda part: f"`experiments/measured/{stamp}_{part}.jsonl`"
    doc = [f"# Current results: revision {rev}{' (with uncommitted changes)' if dirty else ''}, {gpu}, {date}", "",
           "Every figure below comes from one visit to the GPU machine at one revision, each beside its peer measured in "
           "the same call on the same GPU. Regenerate them all with", "", "```",
           "make gpu-bundle                                               # here: everything built against Open MPI for sm_90",
           "experiments/gpu_session.sh build/openmpi OUT tests results   # on the GPU machine (2 GPUs): the suites, then the figures",
           f"experiments/make_results.py OUT                              # here: this page, the measured files, the figures",
           "```", "",
           "Peers (`experiments/peers/`): PyTorch 2.11 with FBGEMM_GPU 1.6.0's table-batched embedding (TBE, TorchRec's "
           "kernel, fp32 rows, optimizer fused into the backward) and the dense layers under `torch.compile` — the "
           "strongest peer a user would pick — and plain PyTorch (`nn.EmbeddingBag`). A ratio above 1 means sparta is "
           "faster. Superseded results are in `experiments/measured/archive/`, the history of how they were reached in "
           "`experiments/NOTES_*.md`.", ""]
    if "x" not in machine:
        doc += ["This visit had one GPU: the figures that need two (2 GPUs over 1, the placements across GPUs, the full "
                "MLPerf tables on 2 GPUs, the collectives) are not in it; the last ones measured are in the archive and "
                "the NOTES.", ""]
    sections = [
        ("Training end to end", "bf16, 65536 samples per GPU, the MLPerf table shapes capped at 4M rows, "
         f"{train_keys(recs)}; `bench_train --model dot|dcnv2` (dot: one key per slot, sgd; dcnv2: the MLPerf DCNv2 keys per slot, 214 a "
         "sample, row-wise Adagrad), with the tables' keys hashed (the default) or indexed directly (`--index direct`, "
         "keys in [0, rows) as TBE takes them), beside `peer_dlrm.py --embedding tbe --compile` and `peer_dlrm.py` (`nn.EmbeddingBag` tables) on "
         "one GPU. Dense share: the dense part's GEMM TFLOP per step over `ms_dense`, against the GPU's ~"
         f"{a.peak_tflops:.0f} TFLOP/s bf16 rate.", train_table(recs, a.peak_tflops), "train"),
        ("The full MLPerf v1 tables on 2 GPUs", "`bench_train --model dot --max-rows 40000000 --index direct "
         "--sparse-optimizer rowwise_adagrad` (188M rows of 128, bf16, 65536 samples per GPU) on 2 GPUs: the planner's "
         "plan (`--placement auto`) and each fixed placement.", fullsize_table(recs), "train"),
        ("Tables in host memory", "`bench_collection --tier host --cache-gb G --alpha A --prefill 0` (every row in "
         "pinned host memory under a GPU cache, G GB a table; the tables in host memory share one cache of their "
         "caches' rows; `src/host_tier.h`) against `--tier hbm` in the same call, beside `fbgemm/peer_fbgemm.py "
         "--cache-rows N` (TBE with `EmbeddingLocation.MANAGED_CACHING`, its LRU cache holding as many rows as "
         "sparta's caches and its HBM tables; the same keys' law, a new batch each step: `--fresh-batches`, where "
         "the visit ran it, else one batch repeated, which leaves the peer's cache holding all its rows after the "
         "first step) and the same peer in HBM. The steps timed are the first ones after a start with no row made "
         "(`--prefill 0`): the caches are still filling, for both; the steady rows time 20 steps after 200 "
         "(`--warmup 200`; the 60 GB table's after 500), the caches full and evicting. Each step is timed alone "
         "until every stream of the GPU is idle (sparta's write-back to host memory, which runs beside the step, "
         "included; the peer's steps each end with `torch.cuda.synchronize()`); in parentheses, where the records "
         "have them, 20 more steps enqueued back to back (a step's write-back may then overlap the next step, as in "
         "training; the peer's `train_step_ms_back_to_back`). "
         "`bench_hashtable --evict lru|lfu --stream 10`: a hashed table under a stream of new keys ten times its "
         "cache, every key checked afterwards (its records are in the embedding file).", tier_table(recs),
         "collection"),
        ("Switches weighed", "The same `bench_train` runs with one switch turned the other way (`search0`: "
         "`--gemm-search 0`, cuBLASLt's first algorithm instead of the fastest of its candidates).",
         variants_table(recs), "train"),
        ("Embeddings against FBGEMM", "`bench_embedding` (one table, forward + backward + sgd update, keys uniform) "
         "beside `fbgemm/peer_fbgemm.py` on the same shapes.", embedding_table(recs), "embedding"),
        ("The embedding collection against FBGEMM", "`bench_collection --tables mlperf-v1|dcnv2` (the planner's plan) "
         "beside `fbgemm/peer_fbgemm.py --tables mlperf-v1|dcnv2` (every table in one TBE).", collection_table(recs), "collection"),
        ("Placements", "`bench_collection --index direct`, sgd, ms per step at 65536 samples per GPU, every placement "
         "and the planner's plan.", placement_table(recs), "collection"),
        ("Collectives", "`bench_alltoall --modes nccl` beside `peer_a2a.py` (NCCL through `torch.distributed`) on the "
         "same GPUs.", comm_table(recs), "comm"),
    ]
    for title, text, table, part in sections:
        if not table:
            continue
        doc += [f"## {title}", "", text + f" Records: {rel(part)}, peers: {rel('peers')}.", ""] + table + [""]
    if closing:
        doc += ["## Tests on the GPUs", "", f"`tests/run_all.sh` on this visit's GPUs, each log's closing lines (every "
                f"suite's line: `experiments/measured/{stamp}_tests.txt`; a log whose name carries a revision ran with "
                "that revision's bundle, e.g. every suite before a fix and the suites the fix touched after it):",
                "", "```"] + closing + ["```", ""]
    if profiles:
        doc += ["## Where the time goes", "", "`experiments/gpu_session.sh BUNDLE OUT profile`: one step's kernels one at "
                "a time under ncu, summed by kernel (`experiments/ncu_summary.py`), and the timeline of training steps "
                "(`bench_train --trace 2`; the host tier's parts in a steady step: `bench_collection --trace 1`): " + ", ".join(f"`experiments/measured/{p}`" for p in profiles) + ".", ""]
    if figs:
        doc += ["## Figures", ""] + [f"![{t}](../{f})" for t, f in figs] + [""]
    with open(os.path.join(a.repo, "experiments", "RESULTS.md"), "w") as f:
        f.write("\n".join(doc))
    print(f"make_results: {stamp}: {len(recs)} records, {len(files)} measured files, {len(figs)} figures, experiments/RESULTS.md")


if __name__ == "__main__":
    main()
