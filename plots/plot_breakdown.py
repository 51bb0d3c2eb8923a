#!/usr/bin/env python3
"""Stacked breakdown of the step time: one bar per record (or per group), one segment per part.

    plots/plot_breakdown.py results/train/results.jsonl --label placement,ranks --out breakdown.png

Parts are the fields --parts (default ms_embedding,ms_dense,ms_comm,ms_data); when --total names a field
(default ms_step, else step_ms) and the parts sum to less, the rest is drawn as "other". Records with the same
label are averaged.
"""
from collections import OrderedDict

import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "breakdown.png")
    p.add_argument("--parts", default="ms_embedding,ms_dense,ms_comm,ms_data")
    p.add_argument("--total", default="ms_step,step_ms", help="fields of the whole step's time, first found")
    p.add_argument("--label", default="placement,ranks,batch", help="fields naming a bar")
    a = p.parse_args()
    parts = rio.split_keys(a.parts)
    totals = rio.split_keys(a.total)
    rows = rio.read_jsonl(a.files, rio.parse_where(a.where))
    rows = rio.require([r for r in rows if any(rio.number(r, k) is not None for k in parts)],
                       f"any of {', '.join(parts)}", a.files)
    keys = [k for k in rio.split_keys(a.label) if any(k in r for r in rows)]
    bars = OrderedDict()
    for values, group in rio.group_by(rows, keys).items():
        seg = [sum(rio.number(r, k) or 0.0 for r in group) / len(group) for k in parts]
        total = None
        for r in group:
            t = next((rio.number(r, k) for k in totals if rio.number(r, k) is not None), None)
            if t is not None:
                total = (total or 0.0) + t / len(group)
        other = max(0.0, total - sum(seg)) if total is not None else 0.0
        bars[rio.group_label(keys, values) or str(len(bars))] = seg + [other]
    names = parts + ["other"]
    fig, ax = plt.subplots(figsize=(max(6, 0.9 * len(bars) + 2), 4.8))
    bottom = [0.0] * len(bars)
    labels = list(bars)
    for i, name in enumerate(names):
        ys = [bars[l][i] for l in labels]
        if name == "other" and not any(ys):
            continue
        ax.bar(range(len(labels)), ys, 0.6, bottom=bottom, label=name.replace("ms_", ""))
        bottom = [b + y for b, y in zip(bottom, ys)]
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time per step (ms)")
    ax.set_xlabel(", ".join(keys) if keys else "record")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(a.title or rio.provenance_title(rows) or "step breakdown", fontsize=9)
    rio.save(fig, a.out, f"{len(bars)} bar(s)")


if __name__ == "__main__":
    main()
