"""Peer figures for one GPU: FBGEMM_GPU's table-batched embedding (TBE, SplitTableBatchedEmbeddingBagsCodegen,
the kernel TorchRec runs), beside peer_torch.py (same shapes, arguments, timing and JSON fields).

Needs fbgemm_gpu on PYTHONPATH (reassemble.sh sets it up from the chunks on the GPU machine):
    python3 peer_fbgemm.py --rows 40000000 --dim 128 --batch 65536 --slots 26 --hot 1 --alpha 0
    python3 peer_fbgemm.py --rows 40000000 --dim 128 --batch 65536 --hotness 3,2,1,2,6,1,1,1,1,7,3,8,1,6,9,5,1,1,1,12,100,27,10,3,1,1
    python3 peer_fbgemm.py --tables mlperf-v1 --cap 4000000 --dim 128 --batch 65536 --optimizers sgd
Two shapes:
  --tables peer (default): peer_torch.py's job. --layout shared (default): one table of --rows rows that every slot
      reads (feature_table_map all 0), as peer_torch's single nn.EmbeddingBag; the keys are peer_torch's keys
      (same seed, same RNG draws, device copy measured first as there), reordered to TBE's feature-major layout
      (bag (slot t, sample b) is bag t * batch + b), so every bag holds the same keys as in peer_torch.
      --layout per-slot: --slots tables of rows // slots rows each (one table per slot, as TorchRec would place
      them), each slot's keys drawn in its own table. Step: forward, .sum().backward() (as peer_torch), the
      optimizer fused into the backward. Timing as peer_torch: forward median of 20 after 5, step median of 10 after 3.
  --tables mlperf-v1 | dcnv2: experiments/peers/torch_collection.py's job (bench_collection's shape): the 26 MLPerf DLRM
      tables (the MLPerf cardinalities) capped at --cap rows, one TBE holding all of them, one key per slot
      (mlperf-v1) or the DCNv2 keys per slot (dcnv2); keys as torch_collection.py draws them (same seed and order),
      step = forward, backward of a fixed upstream gradient (randn [batch, tables, dim]), fused update; forward
      under no_grad; both medians of --iters (20) after --warmup (5).
Optimizers (--optimizers, comma list, one JSON row each, a fresh module each): sgd = EXACT_SGD, rowwise_adagrad =
EXACT_ROWWISE_ADAGRAD (momentum per row, eps --eps); learning rate --lr. Weights (--weights-precisions, comma
list, one JSON row each: fp32, or fp16, TBE's weights_precision FP16 with its stochastic rounding; sparta's side:
--storage bf16|fp16) in HBM (EmbeddingLocation.DEVICE), output fp32, pooling SUM, uniform(-0.1, 0.1) initial weights, bounds check
--bounds-check (default none: no extra kernel; TBE's own default is warning).
Check (before timing, on the fresh module): the forward of --check-bags random bags against a plain torch
gather-sum (float64) of the same rows; one step's update of up to 256 touched rows of the first slot's table
against the host formula (sgd: w - lr * g; rowwise_adagrad: m = mean(g^2), w - lr * g / (sqrt(m) + eps), g the
row's gradient summed over its bags). A failed check is reported in the JSON row and the script exits 1 after
printing everything.
Besides the medians of single calls (each bracketed by CUDA events, as peer_torch), fwd_ms_back_to_back and
train_step_ms_back_to_back time --iters calls enqueued back to back between two events (as peer_a2a.py): TBE's
Python front end costs host time per call, which the first figures include wherever the GPU waits for the host.
--device cpu runs the same flow on TBE's CPU kernels (a smoke test of this script on a machine without a GPU).
Prints one JSON object per case; --out FILE also appends them there (JSON lines).
"""
import argparse, json, os, sys, time
import torch

MLPERF_V1_CARDINALITIES = [39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10,
                           2208, 11938, 155, 4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36]
DCNV2_HOTNESS = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
CUDA = True  # False under --device cpu


def median_ms(fn, iters=20, warm=5):
    for _ in range(warm):
        fn()
    if not CUDA:  # --device cpu (smoke test): wall clock
        times = []
        for _ in range(iters):
            t = time.perf_counter(); fn(); times.append((time.perf_counter() - t) * 1e3)
        return sorted(times)[len(times) // 2]
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); fn(); stop.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def back_to_back_ms(fn, iters=20, warm=5):
    """Mean of iters calls enqueued back to back between two CUDA events (host overhead hidden if the GPU is busier)."""
    for _ in range(warm):
        fn()
    if not CUDA:
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        return (time.perf_counter() - t) * 1e3 / iters
    torch.cuda.synchronize()
    start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(iters):
        fn()
    stop.record(); torch.cuda.synchronize()
    return start.elapsed_time(stop) / iters


def power_law_keys(n, rows, alpha, device, perm=None):
    """Keys in [0, rows) with P(k) ~ k^-alpha (inverse CDF of a continuous power law), shuffled over rows (by perm,
    the same for every batch of a run, else a fresh permutation)."""
    u = torch.rand(n, device=device, dtype=torch.float64)
    if alpha == 0:
        k = (u * rows).long()
    else:
        a = 1.0 - alpha if alpha != 1.0 else 1e-9
        k = ((((rows + 1.0) ** a - 1.0) * u + 1.0) ** (1.0 / a) - 1.0).long()
    k.clamp_(0, rows - 1)
    return (torch.randperm(rows, device=device) if perm is None else perm)[k]


def copy_bandwidth(device):
    a = torch.empty(2 * 1024**3 if CUDA else 64 * 1024**2, dtype=torch.uint8, device=device).random_()
    b = torch.empty_like(a)
    ms = median_ms(lambda: b.copy_(a))
    return 2 * a.numel() / ms / 1e6  # GB/s, bytes read + written


def load_cache_addon(fbgemm_gpu):
    """An archive packed without the cache's libraries (pack.sh) gets them from the add-on (CACHE=only pack.sh),
    unpacked into the package's directory: loaded here when the package's own list left them out."""
    here = os.path.dirname(fbgemm_gpu.__file__)
    for lib in ("fbgemm_gpu_tbe_cache", "fbgemm_gpu_py"):
        path = os.path.join(here, lib + ".so")
        loaded = getattr(torch.ops, "loaded_libraries", set())
        if os.path.exists(path) and path not in loaded and lib not in getattr(fbgemm_gpu, "fbgemm_gpu_libraries", []):
            torch.ops.load_library(path)


def import_fbgemm():
    try:
        import fbgemm_gpu  # noqa: F401  (loads the operator libraries)
        from fbgemm_gpu.split_table_batched_embeddings_ops_training import SplitTableBatchedEmbeddingBagsCodegen
        from fbgemm_gpu.split_table_batched_embeddings_ops_common import (
            BoundsCheckMode, ComputeDevice, EmbeddingLocation, PoolingMode)
        from fbgemm_gpu.split_embedding_configs import EmbOptimType, SparseType
        try:  # --cache-rows (MANAGED_CACHING) needs it, and fbgemm_gpu_tbe_cache.so at run time
            from fbgemm_gpu.split_table_batched_embeddings_ops_common import CacheAlgorithm
        except ImportError:
            CacheAlgorithm = None
        load_cache_addon(fbgemm_gpu)
    except Exception as e:  # noqa: BLE001
        sys.exit(f"peer_fbgemm: cannot import fbgemm_gpu ({type(e).__name__}: {e}); "
                 "run reassemble.sh build and put its directory on PYTHONPATH")
    return dict(TBE=SplitTableBatchedEmbeddingBagsCodegen, BoundsCheckMode=BoundsCheckMode,
                ComputeDevice=ComputeDevice, EmbeddingLocation=EmbeddingLocation, PoolingMode=PoolingMode,
                OptimType=EmbOptimType, SparseType=SparseType, CacheAlgorithm=CacheAlgorithm, version=getattr(fbgemm_gpu, "__version__", "?"))


class Job:
    """One TBE input: tables (rows each), feature_table_map, hotness per feature, feature-major indices/offsets."""

    def __init__(self, table_rows, ftm, hot, batch, dim, indices, offsets):
        self.table_rows, self.ftm, self.hot, self.B, self.dim = table_rows, ftm, hot, batch, dim
        self.indices, self.offsets = indices, offsets
        self.T = len(ftm)
        self.nnz = int(indices.numel())

    def feature_slice(self, t):
        """Positions of feature t's keys in indices (bags t*B .. t*B+B-1)."""
        lo = int(self.offsets[t * self.B]); hi = int(self.offsets[(t + 1) * self.B])
        return lo, hi

    def unique_keys(self):
        first = [0]
        for r in self.table_rows[:-1]:
            first.append(first[-1] + r)
        lin = []
        for t in range(self.T):
            lo, hi = self.feature_slice(t)
            lin.append(self.indices[lo:hi] + first[self.ftm[t]])
        return int(torch.cat(lin).unique().numel())


def peer_job(a, device):
    """peer_torch.py's shape: keys drawn exactly as peer_torch draws them, then laid out feature-major."""
    hot = a.hotness or [a.hot] * a.slots
    T, B, H = len(hot), a.batch, sum(hot)
    lengths_sm = torch.tensor(hot, device=device).repeat(B)  # sample-major: [sample][slot]
    n = int(lengths_sm.sum())
    if a.layout == "shared":
        perm = torch.randperm(a.rows, device=device)
        firsts = [0]
        for h in hot[:-1]:
            firsts.append(firsts[-1] + h)

        def draw():
            keys_sm = power_law_keys(n, a.rows, a.alpha, device, perm).view(B, H)
            return torch.cat([keys_sm[:, f:f + h].reshape(-1) for f, h in zip(firsts, hot)]).contiguous()
        table_rows, ftm = [a.rows], [0] * T
    else:
        per = a.rows // T
        perms = [torch.randperm(per, device=device) for _ in hot]

        def draw():
            return torch.cat([power_law_keys(B * h, per, a.alpha, device, pm) for h, pm in zip(hot, perms)])
        table_rows, ftm = [per] * T, list(range(T))
    lengths = torch.cat([torch.full((B,), h, device=device, dtype=torch.long) for h in hot])
    offsets = torch.zeros(T * B + 1, device=device, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return with_batches(Job(table_rows, ftm, hot, B, a.dim, draw(), offsets), draw, a.fresh_batches)


def with_batches(job, draw, n):
    """job.batches: the indices of n batches of the same keys' law (n > 1: --fresh-batches, the timed steps cycle
    through them, as sparta's benchmarks draw a new batch each step); the first is job.indices."""
    job.batches = [job.indices] + [draw() for _ in range(max(n, 1) - 1)]
    return job


def collection_job(a, device):
    """torch_collection.py's shape and keys: per table, sample-major within the table (TBE's layout already)."""
    rows = [min(c, a.cap) for c in MLPERF_V1_CARDINALITIES]
    hot = [1] * len(rows) if a.tables == "mlperf-v1" else DCNV2_HOTNESS
    B = a.batch
    perms = [torch.randperm(n, device=device) for n in rows]

    def draw():
        return torch.cat([power_law_keys(B * h, n, a.alpha, device, pm) for n, h, pm in zip(rows, hot, perms)])
    lengths = torch.cat([torch.full((B,), h, device=device, dtype=torch.long) for h in hot])
    offsets = torch.zeros(len(rows) * B + 1, device=device, dtype=torch.long)
    torch.cumsum(lengths, 0, out=offsets[1:])
    return with_batches(Job(rows, list(range(len(rows))), hot, B, a.dim, draw(), offsets), draw, a.fresh_batches)


def make_tbe(fb, job, optimizer, a, device, precision="fp32"):
    O = fb["OptimType"]
    opt = {"sgd": O.EXACT_SGD, "rowwise_adagrad": O.EXACT_ROWWISE_ADAGRAD}[optimizer]
    where = (fb["EmbeddingLocation"].DEVICE, fb["ComputeDevice"].CUDA) if CUDA else \
        (fb["EmbeddingLocation"].HOST, fb["ComputeDevice"].CPU)
    cache = {}
    if a.cache_rows > 0:
        # MANAGED_CACHING: the rows in CUDA managed memory, an LRU or LFU cache of cache_rows of them in HBM (the
        # same rows as sparta's --cache-rows). A managed allocation larger than the GPU's free memory can stall the
        # GPU for every process on a shared machine: refused here, before TBE allocates.
        if not CUDA or fb["CacheAlgorithm"] is None:
            sys.exit("peer_fbgemm: --cache-rows needs --device cuda and fbgemm_gpu's CacheAlgorithm (repack with "
                     "fbgemm_gpu_tbe_cache: pack.sh)")
        total = sum(job.table_rows)
        state = 1 if optimizer == "rowwise_adagrad" else 0
        managed = total * (job.dim * (2 if precision == "fp16" else 4) + state * 4)
        free = torch.cuda.mem_get_info()[0]
        if managed > 0.8 * free:
            sys.exit(f"peer_fbgemm: --cache-rows: the managed table ({managed / 1e9:.1f} GB) must stay below the "
                     f"GPU's free memory ({free / 1e9:.1f} GB, 80% of it): lower --rows")
        where = (fb["EmbeddingLocation"].MANAGED_CACHING, fb["ComputeDevice"].CUDA)
        cache = {"cache_load_factor": min(1.0, a.cache_rows / total),
                 "cache_algorithm": getattr(fb["CacheAlgorithm"], a.cache_algorithm.upper())}
    specs = [(r, job.dim) + where for r in job.table_rows]
    bc = {"none": "NONE", "warning": "WARNING", "fatal": "FATAL"}[a.bounds_check]
    tbe = fb["TBE"](
        specs, feature_table_map=job.ftm, optimizer=opt, learning_rate=a.lr, eps=a.eps,
        weights_precision=getattr(fb["SparseType"], precision.upper()), output_dtype=fb["SparseType"].FP32,
        pooling_mode=fb["PoolingMode"].SUM, bounds_check_mode=getattr(fb["BoundsCheckMode"], bc), device=device,
        **cache)
    tbe.init_embedding_weights_uniform(-0.1, 0.1)
    return tbe


def weights_of(tbe):
    """The tables' rows; with a cache (MANAGED_CACHING) its newer rows written back first."""
    if hasattr(tbe, "flush"):
        tbe.flush()
    return tbe.split_embedding_weights()


def check_forward(tbe, job, n_bags, gen):
    """Pooled output of sampled bags against a float64 gather-sum of the same rows. Returns (ok, max_abs_err)."""
    B, dim = job.B, job.dim
    weights = weights_of(tbe)
    with torch.no_grad():
        out = tbe(job.indices, job.offsets)
    sel = torch.randint(0, job.T * B, (n_bags,), device=out.device, generator=gen)
    start, end = job.offsets[sel], job.offsets[sel + 1]
    L = end - start
    owner = torch.repeat_interleave(torch.arange(n_bags, device=out.device), L)
    first = torch.cumsum(L, 0) - L
    pos = start[owner] + torch.arange(int(L.sum()), device=out.device) - first[owner]
    keys = job.indices[pos]
    t_of_bag = sel // B
    tbl_of_key = torch.tensor(job.ftm, device=out.device)[t_of_bag][owner]
    ref = torch.zeros(n_bags, dim, device=out.device, dtype=torch.float64)
    for tau in sorted(set(job.ftm)):
        m = tbl_of_key == tau
        if bool(m.any()):
            ref.index_add_(0, owner[m], weights[tau][keys[m]].double())
    got = out.view(B, job.T, dim)[sel % B, t_of_bag].double()
    err = float((got - ref).abs().max())
    return bool(torch.allclose(got, ref, rtol=1e-5, atol=1e-5)), err


def check_update(tbe, job, optimizer, upstream, a, gen, precision="fp32"):
    """One step on the fresh module; up to 256 touched rows of feature 0's table against the host formula (fp16
    weights: within one fp16 step of it, 2^-10 relative, as their rounding allows)."""
    B, dim, tau = job.B, job.dim, job.ftm[0]
    lo, hi = job.feature_slice(0)
    cand = job.indices[lo:hi].unique()
    rows = cand[torch.randperm(cand.numel(), device=cand.device, generator=gen)[:256]].sort().values
    g = torch.zeros(rows.numel(), dim, device=rows.device, dtype=torch.float64)
    for t in range(job.T):
        if job.ftm[t] != tau:
            continue
        lo, hi = job.feature_slice(t)
        idx = job.indices[lo:hi]
        bag = torch.repeat_interleave(torch.arange(B, device=idx.device), job.hot[t])
        m = torch.isin(idx, rows)
        if not bool(m.any()):
            continue
        slot = torch.searchsorted(rows, idx[m])
        if upstream is None:  # .sum().backward(): a gradient of ones
            g.index_add_(0, slot, torch.ones(int(m.sum()), dim, device=idx.device, dtype=torch.float64))
        else:
            g.index_add_(0, slot, upstream.view(B, job.T, dim)[bag[m], t].double())
    w0 = weights_of(tbe)[tau][rows].double().clone()
    out = tbe(job.indices, job.offsets)
    if upstream is None:
        out.sum().backward()
    else:
        out.backward(upstream)
    if CUDA:
        torch.cuda.synchronize()
    w1 = weights_of(tbe)[tau][rows].double()
    if optimizer == "sgd":
        want = w0 - a.lr * g
    else:
        m2 = (g * g).mean(1, keepdim=True)
        want = w0 - a.lr * g / (m2.sqrt() + a.eps)
    err = float((w1 - want).abs().max())
    rtol, atol = (1e-5, 1e-6) if precision == "fp32" else (2e-3, 1e-4)
    return bool(torch.allclose(w1, want, rtol=rtol, atol=atol)), err, int(rows.numel())


def run_case(fb, job, optimizer, a, device, upstream, peer_mode, precision="fp32"):
    gen = torch.Generator(device=device); gen.manual_seed(1)
    tbe = make_tbe(fb, job, optimizer, a, device, precision)
    fwd_ok, fwd_err = check_forward(tbe, job, a.check_bags, gen)
    upd_ok, upd_err, upd_rows = check_update(tbe, job, optimizer, upstream, a, gen, precision)
    check = {"forward_matches_gather_sum": fwd_ok, "forward_max_abs_err": fwd_err, "bags_checked": a.check_bags,
             "update_matches_host": upd_ok, "update_max_abs_err": upd_err, "rows_checked": upd_rows}

    calls = [0]

    def indices():  # the next batch's (one batch unless --fresh-batches)
        calls[0] += 1
        return job.batches[(calls[0] - 1) % len(job.batches)]

    if upstream is None:
        def step():
            tbe(indices(), job.offsets).sum().backward()
    else:
        def step():
            tbe(indices(), job.offsets).backward(upstream)

    if peer_mode:  # peer_torch.py's timing: forward with autograd on, 20 after 5; step 10 after 3
        fwd = median_ms(lambda: tbe(indices(), job.offsets), iters=a.iters or 20, warm=a.warmup or 5)
        train = median_ms(step, iters=a.iters or 10, warm=a.warmup or 3)
    else:  # torch_collection.py's timing: forward under no_grad, both --iters after --warmup
        with torch.no_grad():
            fwd = median_ms(lambda: tbe(indices(), job.offsets), iters=a.iters or 20, warm=a.warmup or 5)
        train = median_ms(step, iters=a.iters or 20, warm=a.warmup or 5)
    fwd_b2b = back_to_back_ms(lambda: tbe(indices(), job.offsets), iters=a.iters or 20, warm=a.warmup or 3)
    train_b2b = back_to_back_ms(step, iters=a.iters or 20, warm=a.warmup or 3)
    mem = torch.cuda.max_memory_allocated() / 2**30 if CUDA else None
    del tbe
    if CUDA:
        torch.cuda.empty_cache(); torch.cuda.reset_peak_memory_stats()
    return fwd, train, fwd_b2b, train_b2b, check, mem


def main():
    p = argparse.ArgumentParser(description="FBGEMM TBE peer figures (see the module docstring)")
    p.add_argument("--tables", choices=["peer", "mlperf-v1", "dcnv2"], default="peer")
    p.add_argument("--rows", type=int, default=40_000_000)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--batch", type=int, default=65536)
    p.add_argument("--slots", type=int, default=26)
    p.add_argument("--hot", type=int, default=1)
    p.add_argument("--hotness", type=lambda v: [int(x) for x in v.split(",")], default=None)
    p.add_argument("--alpha", type=float, default=0.0)
    p.add_argument("--layout", choices=["shared", "per-slot"], default="shared", help="--tables peer only")
    p.add_argument("--cap", type=int, default=4_000_000, help="row cap of the MLPerf tables")
    p.add_argument("--optimizers", type=lambda v: v.split(","), default=["sgd"], help="sgd,rowwise_adagrad")
    p.add_argument("--lr", type=float, default=0.01)
    p.add_argument("--eps", type=float, default=1e-8, help="rowwise_adagrad epsilon (TBE's default)")
    p.add_argument("--bounds-check", choices=["none", "warning", "fatal"], default="none")
    p.add_argument("--iters", type=int, default=0, help="timed repeats (0: the mirrored script's)")
    p.add_argument("--warmup", type=int, default=0, help="untimed repeats first (0: the mirrored script's)")
    p.add_argument("--check-bags", type=int, default=4096)
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                   help="cpu: smoke test of this script on a machine without a GPU (TBE's CPU kernels; tiny shapes)")
    p.add_argument("--weights-precisions", type=lambda v: v.split(","), default=["fp32"],
                   help="fp32,fp16: TBE's weights_precision, one JSON row each (sparta's --storage)")
    p.add_argument("--cache-rows", type=int, default=0,
                   help="EmbeddingLocation.MANAGED_CACHING with an HBM cache of this many rows (0: the tables in HBM)")
    p.add_argument("--cache-algorithm", choices=["lru", "lfu"], default="lru")
    p.add_argument("--fresh-batches", type=int, default=1,
                   help="the timed calls (forward, then step, one after the other) cycle through this many "
                        "batches of the same keys' law (1: one batch repeated: a cache then holds all its rows after "
                        "the first call, where sparta's benchmarks draw a new batch each step; 2 x (warmup + iters): "
                        "every forward and step its own batch)")
    p.add_argument("--out")
    a = p.parse_args()
    for w in a.weights_precisions:
        if w not in ("fp32", "fp16"):
            p.error(f"--weights-precisions: fp32 or fp16, found '{w}'")
    for o in a.optimizers:
        if o not in ("sgd", "rowwise_adagrad"):
            p.error(f"--optimizers: sgd or rowwise_adagrad, found '{o}'")
    if a.dim % 4:
        p.error("--dim: TBE needs a multiple of 4")
    global CUDA
    CUDA = a.device == "cuda"
    fb = import_fbgemm()
    torch.manual_seed(0)
    device = torch.device(a.device)
    gpu = torch.cuda.get_device_name(0) if CUDA else "cpu"
    rows = []
    t0 = time.perf_counter()
    if a.tables == "peer":
        rows.append({"peer": "device_copy", "by": "peer_fbgemm", "gpu": gpu, "copy_GBps": copy_bandwidth(device)})
        job = peer_job(a, device)
        upstream = None  # .sum().backward(), as peer_torch
    else:
        job = collection_job(a, device)
        upstream = torch.randn(a.batch, job.T, a.dim, device=device).view(a.batch, job.T * a.dim)
    unique = job.unique_keys()
    failed = False
    for opt, precision in [(o, w) for o in a.optimizers for w in a.weights_precisions]:
        fwd, train, fwd_b2b, train_b2b, check, mem = run_case(fb, job, opt, a, device, upstream, a.tables == "peer",
                                                              precision)
        failed |= not (check["forward_matches_gather_sum"] and check["update_matches_host"])
        common = {"fwd_ms_back_to_back": fwd_b2b, "train_step_ms_back_to_back": train_b2b, "gpu": gpu, "optimizer": {"sgd": "exact_sgd", "rowwise_adagrad": "exact_rowwise_adagrad"}[opt],
                  "lr": a.lr, "bounds_check": a.bounds_check, "weights": precision, "max_mem_GiB": mem, "check": check,
                  "torch": torch.__version__, "fbgemm_gpu": fb["version"], "cache_rows": a.cache_rows,
                  "cache_algorithm": a.cache_algorithm if a.cache_rows > 0 else None,
                  "fresh_batches": a.fresh_batches}
        if a.tables == "peer":
            hot = job.hot
            wb = 4 if precision == "fp32" else 2  # bytes of a stored element
            moved = job.nnz * a.dim * wb + a.batch * len(hot) * a.dim * 4  # rows gathered + pooled output written
            rows.append({"peer": "fbgemm.tbe", "layout": a.layout, "rows": a.rows, "dim": a.dim, "batch": a.batch,
                         "slots": len(hot), "hot": a.hot if not a.hotness else ",".join(map(str, hot)),
                         "nnz": job.nnz, "alpha": a.alpha, "unique_keys": unique, "fwd_ms": fwd,
                         "fwd_GBps": moved / fwd / 1e6, "train_step_ms": train, **common})
        else:
            moved = job.nnz * a.dim * (4 if precision == "fp32" else 2) + a.batch * job.T * a.dim * 4
            rows.append({"peer": "fbgemm.tbe.collection", "layout": "tbe", "tables": a.tables, "num_tables": job.T,
                         "rows": job.table_rows, "dim": a.dim, "hotness": job.hot, "batch": a.batch, "nnz": job.nnz,
                         "alpha": a.alpha, "unique_keys": unique, "fwd_ms": fwd, "fwd_GBps": moved / fwd / 1e6,
                         "step_ms": train, "Msamples_per_s": a.batch / train / 1e3, **common})
    for r in rows:
        print(json.dumps(r), flush=True)
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(r) + "\n")
    print(f"# peer_fbgemm: {time.perf_counter() - t0:.1f} s", file=sys.stderr)
    if failed:
        sys.exit("peer_fbgemm: check failed (see the JSON rows' check field)")


if __name__ == "__main__":
    main()
