#!/usr/bin/env python3
"""Training curves: loss and AUC against step, from metrics JSON lines (fields step, loss, auc).

    plots/plot_training.py run/metrics.jsonl [--group split] --out training.png

Records without step are skipped; loss and AUC are drawn where present, one line per --group value (default
split: train and eval lines of one file), and per file when several are given.
"""
import os

import matplotlib.pyplot as plt

import results_io as rio


def main():
    p = rio.common_parser(__doc__, "training.png")
    p.add_argument("--group", default="split")
    a = p.parse_args()
    keys = rio.split_keys(a.group)
    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(11, 4.3))
    total = 0
    for path in a.files:
        rows = [r for r in rio.read_jsonl([path], rio.parse_where(a.where)) if rio.number(r, "step") is not None]
        total += len(rows)
        ks = [k for k in keys if any(k in r for r in rows)]
        for values, group in rio.group_by(rows, ks).items():
            name = ", ".join(x for x in ((os.path.basename(path) if len(a.files) > 1 else ""),
                                         rio.group_label(ks, values)) if x)
            for ax, field in ((ax_loss, "loss"), (ax_auc, "auc")):
                pts = sorted((rio.number(r, "step"), rio.number(r, field)) for r in group
                             if rio.number(r, field) is not None)
                if pts:
                    ax.plot([s for s, _ in pts], [v for _, v in pts], marker="." if len(pts) < 50 else None,
                            label=name or field)
    if not total:
        rio.fail(f"no record with step in {', '.join(a.files)}")
    ax_loss.set_ylabel("loss (binary cross-entropy)")
    ax_auc.set_ylabel("AUC")
    for ax in (ax_loss, ax_auc):
        ax.set_xlabel("step")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        else:
            ax.text(0.5, 0.5, "no values", ha="center", va="center", transform=ax.transAxes)
    fig.suptitle(a.title or "training", fontsize=9)
    rio.save(fig, a.out, f"{total} records")


if __name__ == "__main__":
    main()
