#!/usr/bin/env python3
"""Collective bandwidth against message size, one line per communication mode (and rank count), one panel per
operation (all-to-all, all-reduce, ...).

    plots/plot_alltoall.py results/alltoall/results.jsonl --out alltoall.png [--y algbw_GBps]

Reads bench_alltoall's records (bench=bench_alltoall); y is busbw_GBps (default, nccl-tests' bus bandwidth) or
algbw_GBps; the best of repeated records is drawn.
"""
from collections import defaultdict

import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "alltoall.png")
    p.add_argument("--y", default="busbw_GBps", choices=["busbw_GBps", "algbw_GBps", "time_us"])
    p.add_argument("--group", default="mode,ranks,nodes")
    a = p.parse_args()
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where) + [("bench", "bench_alltoall")])
    rows = rio.require([r for r in rows if rio.number(r, "bytes_per_rank") and rio.number(r, a.y) is not None],
                       f"bench=bench_alltoall, bytes_per_rank and '{a.y}'", a.files)
    ops = list(dict.fromkeys(rio.text(r.get("op", "")) for r in rows))
    keys = rio.split_keys(a.group)
    fig, axes = plt.subplots(1, len(ops), figsize=(6.5 * len(ops), 4.5), squeeze=False)
    for ax, op in zip(axes[0], ops):
        sub = [r for r in rows if rio.text(r.get("op", "")) == op]
        for values, group in rio.group_by(sub, keys).items():
            pts = {}
            for r in group:
                x, y = rio.number(r, "bytes_per_rank"), rio.number(r, a.y)
                pts[x] = (min if a.y == "time_us" else max)(pts.get(x, y), y)
            xs = sorted(pts)
            ax.plot(xs, [pts[x] for x in xs], marker="o", label=rio.group_label(keys, values))
        ax.set_xscale("log", base=2)
        xs = sorted({rio.number(r, "bytes_per_rank") for r in sub})
        ticks = xs if len(xs) <= 8 else xs[:: max(1, len(xs) // 8)]
        ax.set_xticks(ticks)
        ax.set_xticklabels([rio.nice_bytes(x) for x in ticks], rotation=30, fontsize=8)
        if a.y == "time_us":
            ax.set_yscale("log")
        ax.set_xlabel("message size per rank")
        ax.set_ylabel({"busbw_GBps": "bus bandwidth (GB/s)", "algbw_GBps": "algorithm bandwidth (GB/s)",
                       "time_us": "time (µs)"}[a.y])
        ax.set_title(op, fontsize=10)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(a.title or rio.provenance_title(rows) or "collectives", fontsize=9)
    rio.save(fig, a.out, f"{len(rows)} records, {len(ops)} operation(s)")


if __name__ == "__main__":
    main()
