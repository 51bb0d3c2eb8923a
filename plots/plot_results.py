#!/usr/bin/env python3
"""Any field against any other from JSON lines (bench_*, sweeps), one line per group; log-scaled where the
data spans decades. The specific figures have their own scripts (plot_alltoall, plot_hashtable, ...).

    plots/plot_results.py results/alltoall/results.jsonl --x bytes_per_rank --y busbw_GBps --group mode --out a2a.png
    plots/plot_results.py results/embedding/results.jsonl --x batch --y ms --group dim --where mode=eval
Records lacking x or y are skipped; --where KEY=VALUE keeps only matching records (repeatable).
"""
import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "plot.png")
    p.add_argument("--x", required=True)
    p.add_argument("--y", required=True)
    p.add_argument("--group", help="comma-separated fields whose values make separate lines")
    p.add_argument("--xlabel", help="x axis label with its unit (default: the field name)")
    p.add_argument("--ylabel", help="y axis label with its unit (default: the field name)")
    a = p.parse_args()
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where))
    rows = rio.require([r for r in rows if rio.value(r, a.x) is not None and rio.value(r, a.y) is not None],
                       f"both '{a.x}' and '{a.y}'", a.files)
    keys = rio.split_keys(a.group)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    groups = rio.group_by(rows, keys)
    for values, group in groups.items():
        pts = sorted((rio.value(r, a.x), rio.value(r, a.y)) for r in group)
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=rio.group_label(keys, values) or None)
    rio.log_if_wide(ax, [rio.value(r, a.x) for r in rows], [rio.value(r, a.y) for r in rows])
    ax.set_xlabel(a.xlabel or a.x)
    ax.set_ylabel(a.ylabel or a.y)
    ax.grid(True, alpha=0.3)
    if keys:
        ax.legend(fontsize=8)
    ax.set_title(a.title or rio.provenance_title(rows) or a.y, fontsize=9)
    rio.save(fig, a.out, f"{len(rows)} records, {len(groups)} line(s)")


if __name__ == "__main__":
    main()
