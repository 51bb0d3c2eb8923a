#!/usr/bin/env python3
"""Plot a training run's loss and AUC curves (the JSON lines sparta-train writes with --train.metrics) as a PNG.

    plots/plot_training.py metrics.jsonl --out training.png

Left: the training loss (mean of each log interval) and the evaluation log-loss against the step. Right: the
evaluation AUC against the step, with the teacher's AUC (synthetic data: the best a model can reach) as a line.
Several files (runs) may be given; each gets its own colour. Records: {"record": "train", "step", "loss"},
{"record": "eval", "step", "auc", "logloss"}, {"record": "run", "teacher_auc", ...}.
"""
import argparse
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(path):
    runs, train, evals = [], [], []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                sys.exit(f"{path}:{n}: not a JSON object ({e})")
            kind = rec.get("record")
            if kind == "run":
                runs.append(rec)
            elif kind == "train" and "loss" in rec:
                train.append(rec)
            elif kind == "eval" and "auc" in rec:
                evals.append(rec)
    if not train and not evals:
        sys.exit(f"{path}: no train or eval records")
    # A resumed run appends: keep the last record of every step, in step order.
    train = sorted({r["step"]: r for r in train}.values(), key=lambda r: r["step"])
    evals = sorted({r["step"]: r for r in evals}.values(), key=lambda r: r["step"])
    return runs, train, evals


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="metrics JSON lines of sparta-train")
    p.add_argument("--out", default="training.png")
    p.add_argument("--title", default="")
    a = p.parse_args()

    fig, (ax_loss, ax_auc) = plt.subplots(1, 2, figsize=(11, 4.2))
    teacher = None
    for i, path in enumerate(a.files):
        runs, train, evals = load(path)
        colour = f"C{i}"
        label = os.path.basename(path) if len(a.files) > 1 else ""
        if train:
            ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], color=colour,
                         label=f"{label} train loss".strip())
        if evals:
            ax_loss.plot([r["step"] for r in evals], [r["logloss"] for r in evals], "o--", color=colour, ms=3,
                         label=f"{label} eval log-loss".strip())
            ax_auc.plot([r["step"] for r in evals], [r["auc"] for r in evals], "o-", color=colour, ms=3,
                        label=f"{label} eval AUC".strip())
        for r in runs + evals:
            t = r.get("teacher_auc")
            if isinstance(t, (int, float)) and t >= 0:
                teacher = t
    if teacher is not None:
        ax_auc.axhline(teacher, color="k", ls=":", label=f"teacher AUC {teacher:.4f}")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("binary cross-entropy")
    ax_loss.set_title("loss")
    ax_loss.grid(alpha=0.3)
    ax_loss.legend()
    ax_auc.set_xlabel("step")
    ax_auc.set_ylabel("AUC")
    ax_auc.set_title("evaluation AUC")
    ax_auc.grid(alpha=0.3)
    ax_auc.legend(loc="lower right")
    if a.title:
        fig.suptitle(a.title)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
