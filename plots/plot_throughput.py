#!/usr/bin/env python3
"""Throughput against batch size, one line per group (placement, GPUs, ...).

    plots/plot_throughput.py results/train/results.jsonl --group placement,ranks --out throughput.png
    plots/plot_throughput.py results/embedding/results.jsonl --where bench=embedding_step --group hot,alpha

y is --y (default samples_per_s: the record's samples_per_s, else batch / step time from step_ms, ms_step or
ms); x is --x (default batch: the global batch when the record has global_batch).
"""
from collections import defaultdict

import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "throughput.png")
    p.add_argument("--x", default="batch", help="x field (default batch; global_batch when present)")
    p.add_argument("--y", default="samples_per_s", help="y field (default samples_per_s, derived when absent)")
    p.add_argument("--group", default="placement,ranks", help="comma-separated fields: one line per value")
    a = p.parse_args()
    keys = rio.split_keys(a.group)
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where))

    def x_of(r):
        if a.x == "batch" and rio.number(r, "global_batch") is not None:
            return rio.number(r, "global_batch")
        return rio.value(r, a.x)

    rows = rio.require([r for r in rows if x_of(r) is not None and rio.value(r, a.y) is not None],
                       f"'{a.x}' and '{a.y}'", a.files)
    keys = [k for k in keys if any(k in r for r in rows)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for values, group in rio.group_by(rows, keys).items():
        pts = defaultdict(list)
        for r in group:
            pts[x_of(r)].append(rio.value(r, a.y))
        xs = sorted(pts)
        ax.plot(xs, [max(pts[x]) for x in xs], marker="o", label=rio.group_label(keys, values) or None)
    rio.log_if_wide(ax, [x_of(r) for r in rows], [rio.value(r, a.y) for r in rows])
    ax.set_xlabel(f"{a.x} (samples per step)")
    ax.set_ylabel("throughput (samples/s)" if a.y == "samples_per_s" else a.y)
    ax.grid(True, alpha=0.3)
    if keys:
        ax.legend(fontsize=8)
    ax.set_title(a.title or rio.provenance_title(rows) or "throughput vs batch", fontsize=9)
    rio.save(fig, a.out, f"{len(rows)} records")


if __name__ == "__main__":
    main()
