#!/usr/bin/env python3
"""Placements side by side: one group of bars per configuration (--x, default ranks), one bar per placement.

    plots/plot_placements.py results/train/results.jsonl --y samples_per_s --out placements.png

Bars show the best record of each (configuration, placement); a placement absent at a configuration leaves a
gap. --y defaults to samples_per_s (derived from batch and step time when absent).
"""
import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "placements.png")
    p.add_argument("--x", default="ranks", help="field naming the configuration of a group of bars")
    p.add_argument("--y", default="samples_per_s")
    p.add_argument("--by", default="placement", help="field whose values are the bars of a group")
    p.add_argument("--lower-is-better", action="store_true", help="keep the smallest y of repeats (times)")
    a = p.parse_args()
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where))
    rows = rio.require([r for r in rows if a.by in r and a.x in r and rio.value(r, a.y) is not None],
                       f"'{a.by}', '{a.x}' and '{a.y}'", a.files)
    configs = sorted({rio.text(r[a.x]) for r in rows}, key=lambda s: (len(s), s))
    kinds = list(dict.fromkeys(rio.text(r[a.by]) for r in rows))
    pick = min if a.lower_is_better else max
    best = {}
    for r in rows:
        k = (rio.text(r[a.x]), rio.text(r[a.by]))
        v = rio.value(r, a.y)
        best[k] = pick(best[k], v) if k in best else v
    fig, ax = plt.subplots(figsize=(max(6, 1.2 * len(configs) * max(1, len(kinds)) / 2), 4.5))
    width = 0.8 / len(kinds)
    for i, kind in enumerate(kinds):
        xs = [j + (i - (len(kinds) - 1) / 2) * width for j, c in enumerate(configs) if (c, kind) in best]
        ys = [best[(c, kind)] for c in configs if (c, kind) in best]
        ax.bar(xs, ys, width, label=f"{a.by}={kind}")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs)
    ax.set_xlabel(f"{a.x}" + (" (GPUs)" if a.x in ("ranks", "gpus") else ""))
    ax.set_ylabel("throughput (samples/s)" if a.y == "samples_per_s" else a.y)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(a.title or rio.provenance_title(rows) or "placements", fontsize=9)
    rio.save(fig, a.out, f"{len(configs)} configuration(s) x {len(kinds)} {a.by}(s)")


if __name__ == "__main__":
    main()
