#!/usr/bin/env python3
"""One step's kernels from an `ncu --csv` report, summed by kernel: time, DRAM bytes, L2 hit rate, rate.

    experiments/ncu_summary.py REPORT.csv [--step-start REGEX] [--nth-last K] [--title TEXT] [--min-ms 0.01]

REPORT.csv: the standard output of `ncu --clock-control none --csv --metrics gpu__time_duration.sum,
dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct PROGRAM ...` (the program's own lines,
which do not start with a quote, are skipped). The step summed: the kernels from the K-th last launch whose name
matches --step-start (default: the collection's first kernel of a step, `fill_kernel<long>`) up to the next such
launch, or to the end (K = 1, the default: bench_train's last step; bench_collection's check runs two forwards
after its steps, so its last step is K = 3). Kernels are listed by the time they take together, longest first (the ones under --min-ms left out of the
list, not of the totals). Kernels run one at a time under ncu: the times add up to more than an overlapped step.
gpu_session.sh's `profile` part writes these; the NOTES cite them. Exit status 1 when the report holds no kernel
or fewer than K match --step-start.
"""
import argparse
import collections
import csv
import re
import sys

METRICS = ("gpu__time_duration.sum", "dram__bytes_read.sum", "dram__bytes_write.sum", "lts__t_sector_hit_rate.pct")
SCALE = {"ns": 1e-6, "nsecond": 1e-6, "us": 1e-3, "usecond": 1e-3, "ms": 1.0, "msecond": 1.0,
         "byte": 1e-9, "Kbyte": 1e-6, "Mbyte": 1e-3, "Gbyte": 1.0, "%": 1.0, "": 1.0}


def read_kernels(path):
    """Kernel launches in order: {name, metric: value in ms, GB or %}."""
    kernels = collections.OrderedDict()
    with open(path) as f:
        for row in csv.DictReader(line for line in f if line.startswith('"')):
            k = kernels.setdefault(int(row["ID"]), {"name": row["Kernel Name"]})
            metric, unit = row["Metric Name"], row["Metric Unit"]
            if metric in METRICS:
                if unit not in SCALE:
                    raise SystemExit(f"ncu_summary: {path}: unit {unit!r} of {metric} not known")
                k[metric] = float(row["Metric Value"].replace(",", "")) * SCALE[unit]
    return [kernels[i] for i in sorted(kernels)]


def short(name):
    """A kernel's name without its arguments and return type, cut at 90 characters."""
    name = name.split("(")[0]
    name = name[5:] if name.startswith("void ") else name
    return name if len(name) <= 90 else name[:87] + "..."


def summarize(kernels, step_start, min_ms, nth_last=1):
    starts = [i for i, k in enumerate(kernels) if re.search(step_start, k["name"])]
    if len(starts) < nth_last:
        return None
    at = len(starts) - nth_last
    step = kernels[starts[at]:starts[at + 1] if at + 1 < len(starts) else len(kernels)]
    by = collections.OrderedDict()
    for k in step:
        s = by.setdefault(short(k["name"]), [0, 0.0, 0.0, 0.0, 0.0])
        t = k.get(METRICS[0], 0.0)
        s[0] += 1
        s[1] += t
        s[2] += k.get(METRICS[1], 0.0)
        s[3] += k.get(METRICS[2], 0.0)
        s[4] += k.get(METRICS[3], 0.0) * t  # time-weighted hit rate
    lines = ["# kernel x launches | ms | DRAM GB read | DRAM GB written | L2 hit % | TB/s"]
    for name, (n, t, r, w, h) in sorted(by.items(), key=lambda x: -x[1][1]):
        if t >= min_ms:
            rate = (r + w) / t if t > 0 else 0.0
            lines.append(f"{name} x{n} | {t:.3f} | {r:.2f} | {w:.2f} | {h / t if t > 0 else 0:.0f} | {rate:.2f}")
    total = [sum(k.get(m, 0.0) for k in step) for m in METRICS[:3]]
    lines.append(f"# total {total[0]:.3f} ms, {total[1]:.2f} GB read, {total[2]:.2f} GB written, {len(step)} kernels "
                 f"(those under {min_ms} ms left out of the list)")
    return lines


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("report")
    p.add_argument("--step-start", default=r"fill_kernel<long>")
    p.add_argument("--nth-last", type=int, default=1)
    p.add_argument("--title", default="")
    p.add_argument("--min-ms", type=float, default=0.01)
    a = p.parse_args()
    kernels = read_kernels(a.report)
    if not kernels:
        print(f"ncu_summary: {a.report}: no kernel", file=sys.stderr)
        return 1
    if a.nth_last < 1:
        print(f"ncu_summary: --nth-last must be >= 1, found {a.nth_last}", file=sys.stderr)
        return 1
    lines = summarize(kernels, a.step_start, a.min_ms, a.nth_last)
    if lines is None:
        print(f"ncu_summary: {a.report}: fewer than {a.nth_last} kernel(s) match --step-start {a.step_start!r}",
              file=sys.stderr)
        return 1
    print("# ncu, kernels one at a time (no overlap); one step of the run" + (f": {a.title}" if a.title else ""))
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
