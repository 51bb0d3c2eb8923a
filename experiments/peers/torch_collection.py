"""The embedding collection's step in plain PyTorch on one GPU: the baseline of bench_collection, run in the same
call on the same shape, so that its figures have a ratio from one run.

The shape is read from a bench_collection record (its JSON line: rows, dims and hotness per table, the batch, the
key alpha, the optimizer and its learning rate), the first one in --like whose tables and alpha match:
    python3 experiments/peers/torch_collection.py --like OUT/bench.jsonl --tables mlperf-v1 --alpha 0 --out OUT/peers.jsonl
Tables must share one dim (the pooled output is [batch, tables, dim], as the collection's).

Two layouts, each a full step (forward, backward of a fixed upstream gradient, optimizer step; sparse gradients):
  tables  one nn.EmbeddingBag(mode="sum", sparse=True) per table and torch.optim.SGD (or Adagrad): what a
          PyTorch user writes first;
  fused   every table's rows in one nn.EmbeddingBag, each table's keys offset by its first row: one lookup, one
          backward and one sparse update a step, as a fused collection runs them.
Keys: uniform (alpha 0) or power law P(k) ~ k^-alpha in [0, rows) of each table, shuffled over the rows. Keys are
row ids already: no hashing, as with the collection's direct index (easier than a hashed table's job).
Check: both layouts' forwards of the same weights and keys agree (bit for bit where every bag has one key: the
pooled vector is the row; within 1e-5 relative otherwise, where the summation order may differ), and one
update of one table's rows by the tables layout equals the host's w - lr * (gradient summed per row).
Prints one JSON object per layout; --out FILE appends them (JSON lines). Timing: CUDA events around each call,
the median of --iters after --warmup.
"""
import argparse, json, sys
import torch


def median_ms(fn, iters, warm):
    for _ in range(warm):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record(); fn(); stop.record(); torch.cuda.synchronize()
        times.append(start.elapsed_time(stop))
    return sorted(times)[len(times) // 2]


def power_law_keys(n, rows, alpha, device):
    """Keys in [0, rows) with P(k) ~ k^-alpha (inverse CDF of a continuous power law), shuffled over rows."""
    u = torch.rand(n, device=device, dtype=torch.float64)
    if alpha == 0:
        k = (u * rows).long()
    else:
        a = 1.0 - alpha if alpha != 1.0 else 1e-9
        k = ((((rows + 1.0) ** a - 1.0) * u + 1.0) ** (1.0 / a) - 1.0).long()
    k.clamp_(0, rows - 1)
    return torch.randperm(rows, device=device)[k]


def shape_from(path, tables, alpha):
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if r.get("program") == "bench_collection" and r.get("tables") == tables and float(r.get("alpha", -1)) == alpha:
                return r
    sys.exit(f"torch_collection: no bench_collection record of --tables {tables} --alpha {alpha} in {path}")


def make_optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if name == "adagrad":
        return torch.optim.Adagrad(params, lr=lr)
    sys.exit(f"torch_collection: optimizer {name} has no sparse PyTorch counterpart here")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--like", required=True, help="JSON lines holding a bench_collection record")
    p.add_argument("--tables", default="mlperf-v1")
    p.add_argument("--alpha", type=float, default=0.0)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--out")
    a = p.parse_args()
    r = shape_from(a.like, a.tables, a.alpha)
    rows, dims, hot = r["rows"], r["dims"], r["hotness"]
    batch = int(r["batch"])  # per rank: the baseline runs one GPU's share
    if len(set(dims)) != 1:
        sys.exit(f"torch_collection: tables of one dim only, found {sorted(set(dims))}")
    dim, T = dims[0], len(rows)
    lr, opt_name = float(r.get("lr", 0.01)), r.get("optimizer", "sgd")
    torch.manual_seed(0)
    dev = torch.device("cuda")

    # Keys per table, sample-major within a table: bag b of table t holds keys [b * hot[t], (b + 1) * hot[t]).
    keys = [power_law_keys(batch * h, n, a.alpha, dev) for n, h in zip(rows, hot)]
    offs = [torch.arange(batch, device=dev) * h for h in hot]
    first = [0]
    for n in rows[:-1]:
        first.append(first[-1] + n)
    fused_keys = torch.cat([k + f for k, f in zip(keys, first)])
    lengths = torch.cat([torch.full((batch,), h, device=dev, dtype=torch.long) for h in hot])
    fused_offs = torch.cumsum(lengths, 0) - lengths
    grad = torch.randn(batch, T, dim, device=dev)  # the upstream gradient of the pooled output

    tables = torch.nn.ModuleList([torch.nn.EmbeddingBag(n, dim, mode="sum", sparse=True, device=dev) for n in rows])
    fused = torch.nn.EmbeddingBag(sum(rows), dim, mode="sum", sparse=True, device=dev)
    with torch.no_grad():
        fused.weight.copy_(torch.cat([t.weight for t in tables]))

    def forward_tables():
        return torch.stack([t(k, o) for t, k, o in zip(tables, keys, offs)], dim=1)

    def forward_fused():
        return fused(fused_keys, fused_offs).view(T, batch, dim).transpose(0, 1).contiguous()

    # Check 1: the two layouts' forwards on the same weights and keys.
    with torch.no_grad():
        y_t, y_f = forward_tables(), forward_fused()
    one_hot = all(h == 1 for h in hot)
    fwd_ok = torch.equal(y_t, y_f) if one_hot else torch.allclose(y_t, y_f, rtol=1e-5, atol=1e-6)
    # Check 2: one SGD step of the tables layout against the host's update of table 0's touched rows.
    upd_ok = None
    if opt_name == "sgd":
        t0 = tables[0]
        touched = torch.unique(keys[0])[:256]
        w0 = t0.weight.detach()[touched].double().cpu()
        g_rows = torch.zeros(rows[0], dim, device=dev, dtype=torch.float64)
        g_rows.index_add_(0, keys[0], grad[:, 0, :].double().repeat_interleave(hot[0], dim=0))
        want = w0 - lr * g_rows[touched].cpu()
        opt = make_optimizer("sgd", tables.parameters(), lr)
        opt.zero_grad(set_to_none=True)
        forward_tables().backward(grad)
        opt.step()
        got = t0.weight.detach()[touched].double().cpu()
        upd_ok = bool(torch.allclose(got, want, rtol=1e-5, atol=1e-6))
    check = {"forward_layouts_agree": bool(fwd_ok), "update_matches_host": upd_ok}

    results = []
    for layout, params, forward in (("tables", tables.parameters(), forward_tables),
                                    ("fused", fused.parameters(), forward_fused)):
        opt = make_optimizer(opt_name, params, lr)

        def step():
            opt.zero_grad(set_to_none=True)
            forward().backward(grad)
            opt.step()

        with torch.no_grad():
            fwd = median_ms(forward, a.iters, a.warmup)
        st = median_ms(step, a.iters, a.warmup)
        results.append({"peer": "torch.collection", "layout": layout, "gpu": torch.cuda.get_device_name(0),
                        "tables": a.tables, "num_tables": T, "rows": rows, "dim": dim, "hotness": hot,
                        "batch": batch, "alpha": a.alpha, "optimizer": opt_name, "lr": lr, "fwd_ms": fwd,
                        "step_ms": st, "Msamples_per_s": batch / st / 1e3, "check": check,
                        "torch": torch.__version__})
    for res in results:
        print(json.dumps(res))
        if a.out:
            with open(a.out, "a") as f:
                f.write(json.dumps(res) + "\n")
    if not fwd_ok or upd_ok is False:
        sys.exit("torch_collection: check failed: " + json.dumps(check))


if __name__ == "__main__":
    main()
