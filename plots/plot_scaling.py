#!/usr/bin/env python3
"""Strong and weak scaling: throughput against GPU count with the ideal line, and the parallel efficiency.

    plots/plot_scaling.py results/train/results.jsonl --series placement --out scaling.png

Records are split into series (--series, default placement) and, inside a series, into strong-scaling sets
(the same global batch at every GPU count) and weak-scaling sets (the same batch per GPU). Efficiency at n GPUs
against the smallest count n0 of the set: E(n) = T(n) / (T(n0) * n / n0), T the throughput (--y, default
samples_per_s), for both kinds: strong scaling keeps the work fixed, weak scaling grows it with n, and in both
perfect scaling multiplies the throughput by n / n0. The global batch is global_batch, else batch x ranks when
--batch-per-gpu says that batch is per GPU, else batch (--batch names another field for the work per step).
"""
from collections import OrderedDict, defaultdict

import matplotlib.pyplot as plt

import results_io as rio


def efficiency(points):
    """points: [(gpus, throughput)] -> [(gpus, efficiency)] against the smallest gpu count (best of repeats)."""
    best = defaultdict(float)
    for n, t in points:
        best[n] = max(best[n], t)
    ns = sorted(best)
    n0 = ns[0]
    return [(n, best[n] / (best[n0] * n / n0)) for n in ns]


def scaling_sets(rows, y, batch_per_gpu, batch_field="batch"):
    """{("strong", global batch) or ("weak", batch per GPU): [(gpus, throughput)]} with two or more GPU counts."""
    sets = OrderedDict()
    for r in rows:
        n = rio.value(r, "gpus")
        t = rio.value(r, y)
        b = rio.number(r, batch_field)
        g = rio.number(r, "global_batch") if batch_field == "batch" else None
        if g is None and b is not None:
            g = b * n if batch_per_gpu else b
        if n is None or t is None or g is None:
            continue
        sets.setdefault(("strong", g), []).append((n, t))
        sets.setdefault(("weak", g / n), []).append((n, t))
    return OrderedDict((k, v) for k, v in sets.items() if len({n for n, _ in v}) >= 2)


def main():
    p = rio.common_parser(__doc__, "scaling.png")
    p.add_argument("--y", default="samples_per_s", help="throughput field (default samples_per_s, derived when absent)")
    p.add_argument("--series", default="placement", help="comma-separated fields: one line per value")
    p.add_argument("--batch-per-gpu", action="store_true", help="the records' batch is per GPU, not global")
    p.add_argument("--batch", default="batch", help="field of the work per step (default batch; e.g. "
                   "bytes_per_rank with --batch-per-gpu for bench_alltoall)")
    a = p.parse_args()
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where))
    rows = rio.require([r for r in rows if rio.value(r, "gpus") is not None and rio.value(r, a.y) is not None],
                       f"ranks and '{a.y}'", a.files)
    keys = [k for k in rio.split_keys(a.series) if any(k in r for r in rows)]
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    lines = 0
    for values, group in rio.group_by(rows, keys).items():
        name = rio.group_label(keys, values)
        for (kind, b), pts in scaling_sets(group, a.y, a.batch_per_gpu, a.batch).items():
            col = 0 if kind == "strong" else 1
            best = defaultdict(float)
            for n, t in pts:
                best[n] = max(best[n], t)
            ns = sorted(best)
            label = f"{name + ', ' if name else ''}{'global' if kind == 'strong' else 'per-GPU'} {a.batch} {b:g}"
            line, = axes[0][col].plot(ns, [best[n] for n in ns], marker="o", label=label)
            axes[0][col].plot(ns, [best[ns[0]] * n / ns[0] for n in ns], ls=":", color=line.get_color())
            eff = efficiency(pts)
            axes[1][col].plot([n for n, _ in eff], [e * 100 for _, e in eff], marker="o", color=line.get_color(),
                              label=label)
            lines += 1
    if not lines:
        rio.fail(f"no set of records with the same global batch or the same batch per GPU at two or more GPU "
                 f"counts in {', '.join(a.files)}")
    for col, kind in enumerate(("strong", "weak")):
        top, bottom = axes[0][col], axes[1][col]
        top.set_title(f"{kind} scaling (dotted: ideal)", fontsize=10)
        top.set_ylabel("throughput (samples/s)" if a.y == "samples_per_s" else a.y)
        bottom.set_ylabel("parallel efficiency (%)")
        bottom.set_ylim(0, 110)
        for ax in (top, bottom):
            ax.set_xlabel("GPUs (ranks)")
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=7)
            else:
                ax.text(0.5, 0.5, f"no {kind}-scaling set", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(a.title or rio.provenance_title(rows) or "scaling", fontsize=9)
    rio.save(fig, a.out, f"{len(rows)} records, {lines} line(s)")


if __name__ == "__main__":
    main()
