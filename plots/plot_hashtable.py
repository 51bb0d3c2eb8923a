#!/usr/bin/env python3
"""Hash-table throughput (G keys/s) against load factor, one line per (operation, dim).

    plots/plot_hashtable.py results/hashtable/results.jsonl --out hashtable.png

Reads bench_hashtable's records (bench=hashtable). x is --x: load_end (the load the table ends a point at,
default), load_start or max_load_factor; the best of repeated records is drawn.
"""
from collections import defaultdict

import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "hashtable.png")
    p.add_argument("--x", default="load_end", choices=["load_end", "load_start", "max_load_factor"])
    p.add_argument("--group", default="op,dim")
    a = p.parse_args()
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where) + [("bench", "hashtable")])
    rows = rio.require([r for r in rows if rio.number(r, a.x) is not None and rio.number(r, "Gkeys_per_s") is not None],
                       f"bench=hashtable, '{a.x}' and Gkeys_per_s", a.files)
    keys = rio.split_keys(a.group)
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for values, group in rio.group_by(rows, keys).items():
        pts = defaultdict(float)
        for r in group:
            x = round(rio.number(r, a.x), 3)
            pts[x] = max(pts[x], rio.number(r, "Gkeys_per_s"))
        xs = sorted(pts)
        ax.plot(xs, [pts[x] for x in xs], marker="o", label=rio.group_label(keys, values))
    ax.set_xlabel({"load_end": "load factor at the end of the point (held keys / slots)",
                   "load_start": "load factor at the start of the point (held keys / slots)",
                   "max_load_factor": "max load factor (configured)"}[a.x])
    ax.set_ylabel("throughput (G keys/s)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(a.title or rio.provenance_title(rows) or "hash table", fontsize=9)
    rio.save(fig, a.out, f"{len(rows)} records")


if __name__ == "__main__":
    main()
