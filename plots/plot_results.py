#!/usr/bin/env python3
"""Plot experiment results (JSON lines written by the bench_* binaries) as a PNG.

One line per group: y against x, log-scaled where the data spans decades.
    plots/plot_results.py results/bench_alltoall.jsonl --x bytes_per_rank --y busbw_GBps --group mode --out a2a.png
    plots/plot_results.py results/bench_embedding.jsonl --x batch --y fwd_ms --group dim --where op=forward
Records lacking x or y are skipped; --where KEY=VALUE keeps only matching records (repeatable).
"""
import argparse
import json
import sys
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def load(paths, where):
    rows = []
    for path in paths:
        with open(path) as f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    sys.exit(f"{path}:{n}: not a JSON object ({e})")
                if all(str(rec.get(k)) == v for k, v in where):
                    rows.append(rec)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+")
    p.add_argument("--x", required=True)
    p.add_argument("--y", required=True)
    p.add_argument("--group", help="field whose values make separate lines")
    p.add_argument("--where", action="append", default=[], help="KEY=VALUE filter")
    p.add_argument("--title")
    p.add_argument("--out", default="plot.png")
    a = p.parse_args()
    where = []
    for w in a.where:
        if "=" not in w:
            sys.exit(f"--where: expected KEY=VALUE, found '{w}'")
        where.append(tuple(w.split("=", 1)))
    rows = [r for r in load(a.files, where) if a.x in r and a.y in r]
    if not rows:
        sys.exit(f"no record has both '{a.x}' and '{a.y}' in {', '.join(a.files)}")
    lines = defaultdict(list)
    for r in rows:
        lines[str(r.get(a.group, "")) if a.group else ""].append((float(r[a.x]), float(r[a.y])))
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, pts in sorted(lines.items()):
        pts.sort()
        ax.plot([x for x, _ in pts], [y for _, y in pts], marker="o", label=f"{a.group}={name}" if a.group else None)
    xs = [float(r[a.x]) for r in rows]
    ys = [float(r[a.y]) for r in rows]
    if min(xs) > 0 and max(xs) / min(xs) >= 100:
        ax.set_xscale("log", base=2)
    if min(ys) > 0 and max(ys) / min(ys) >= 100:
        ax.set_yscale("log")
    ax.set_xlabel(a.x)
    ax.set_ylabel(a.y)
    ax.grid(True, alpha=0.3)
    if a.group:
        ax.legend()
    first = rows[0]
    devices = first.get("devices", "")
    devices = ", ".join(sorted(set(map(str, devices)))) if isinstance(devices, list) else str(devices)
    prov = " ".join(x for x in (str(first.get("host", "")), devices, str(first.get("git_rev", ""))[:10]) if x)
    ax.set_title(a.title or prov or a.y)
    fig.tight_layout()
    fig.savefig(a.out, dpi=120)
    print(f"wrote {a.out} ({len(rows)} records, {len(lines)} line(s))")


if __name__ == "__main__":
    main()
