#!/usr/bin/env python3
"""fit_planner.py: the planner's four rates (src/planner.h PlannerRates) fitted to measured bench_collection steps.

  experiments/fit_planner.py FILE.jsonl [FILE ...] [--where KEY=VALUE ...] [--json]

Every bench_collection record carries the planner's terms for the plan it timed (README, "Planner"):
MB_moved_planned (the busiest rank's link bytes), planned_local_MB (the busiest rank's local passes' device
bytes; records made before the planner kept each rank's bytes, revision 0c647bb, summed a localized plan's owners
as if one rank did all their lookups), planned_collectives and planned_groups (the collectives and the groups whose
fixed costs the step pays). The
planner's estimate of the step is

  ms = MB_moved_planned / link_GBps + planned_local_MB / hbm_GBps
       + (planned_collectives * collective_us + planned_groups * group_us) / 1000

which is linear in x = (1 / link_GBps, 1 / hbm_GBps, collective_us, group_us). The fit is the non-negative least
squares of the relative error, sum over records of ((estimate - ms_step) / ms_step)^2: every subset of the terms is
solved and the best solution with no negative rate is kept. A term that is zero in every record (the link and the
collectives when every record ran on one rank) says nothing about its rate: that rate stays the one the records
were planned with (their planner_* fields), and a rate fitted to zero (its term never needed) stays as well.

Prints the rates, each record's measured and estimated step, and the options that set the rates: sparta-train
--embedding.planner_link_gbps ... (or the [embedding] section of its config) and bench_collection
--planner-link-gbps .... --where keeps the records whose field equals the value (as text: index=direct, ranks=2).
--json prints {"rates": ..., "fitted": ..., "records": N, "mean_abs_error": ...} instead. Exit status 2 when no
record has the terms (bench_collection before they were recorded) or an argument is wrong.
"""
import argparse
import itertools
import json
import signal
import sys

import numpy as np

TERMS = ("MB_moved_planned", "planned_local_MB", "planned_collectives", "planned_groups")
RATES = ("link_GBps", "hbm_GBps", "collective_us", "group_us")
DEFAULTS = {"link_GBps": 646.0, "hbm_GBps": 3730.0, "collective_us": 124.0, "group_us": 334.0}  # src/planner.h
TRAIN_OPTIONS = {"link_GBps": "--embedding.planner_link_gbps", "hbm_GBps": "--embedding.planner_hbm_gbps",
                 "collective_us": "--embedding.planner_collective_us", "group_us": "--embedding.planner_group_us"}
BENCH_OPTIONS = {"link_GBps": "--planner-link-gbps", "hbm_GBps": "--planner-hbm-gbps",
                 "collective_us": "--planner-collective-us", "group_us": "--planner-group-us"}


def as_text(v):
    """A field as --where compares it: whole floats without their ".0" (2.0 reads "2")."""
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def load(files, where):
    """The bench_collection records of the files that have the planner's terms and match where. (Not
    plots/results_io.py's reader: that module loads matplotlib, which fitting needs not.)"""
    rows = []
    for f in files:
        with open(f) as fh:
            for n, line in enumerate(fh, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    r = json.loads(line)
                except json.JSONDecodeError as e:
                    raise SystemExit(f"fit_planner: {f}:{n}: not a JSON line ({e})")
                if r.get("bench") != "collection" or not r.get("ms_step"):
                    continue
                if any(not isinstance(r.get(t), (int, float)) for t in TERMS):
                    continue
                if all(k in r and as_text(r[k]) == v for k, v in where):
                    rows.append(r)
    return rows


def design(rows):
    """A: [records, 4] columns in the units of x (ms per unit of each rate's term), y: measured ms."""
    A = np.array([[r["MB_moved_planned"], r["planned_local_MB"], r["planned_collectives"] / 1e3,
                   r["planned_groups"] / 1e3] for r in rows], dtype=float)
    y = np.array([r["ms_step"] for r in rows], dtype=float)
    return A, y


def nnls_relative(A, y):
    """x >= 0 minimizing sum(((A x - y) / y)^2), over the columns that are not zero everywhere; None where a
    column is all zeros (its rate unconstrained)."""
    W = A / y[:, None]
    ones = np.ones(len(y))
    live = [j for j in range(A.shape[1]) if np.any(A[:, j] != 0)]
    best, best_res = None, np.inf
    for k in range(len(live), 0, -1):
        for cols in itertools.combinations(live, k):
            sol, *_ = np.linalg.lstsq(W[:, cols], ones, rcond=None)
            if np.any(sol < 0):
                continue
            res = float(np.sum((W[:, cols] @ sol - ones) ** 2))
            if res < best_res - 1e-15:
                x = np.zeros(A.shape[1])
                x[list(cols)] = sol
                best, best_res = x, res
    x = [None] * A.shape[1]
    if best is not None:
        for j in live:
            x[j] = float(best[j])
    return x


def planned_rates(rows):
    """The rates the records were planned with (all alike, else the defaults)."""
    out = {}
    for name in RATES:
        vals = {r.get("planner_" + name) for r in rows}
        v = vals.pop() if len(vals) == 1 else None
        out[name] = float(v) if isinstance(v, (int, float)) else DEFAULTS[name]
    return out


def fit(rows):
    """(rates, fitted): the four rates and, per rate, whether the data fixed it."""
    A, y = design(rows)
    x = nnls_relative(A, y)
    rates, fitted = planned_rates(rows), {}
    for j, name in enumerate(RATES):
        v = x[j]
        fitted[name] = v is not None and v > 0
        if not fitted[name]:
            continue
        rates[name] = 1.0 / v if j < 2 else v * 1.0  # x holds 1 / GBps for the two bandwidths
    return rates, fitted


def estimate(r, rates):
    return (r["MB_moved_planned"] / rates["link_GBps"] + r["planned_local_MB"] / rates["hbm_GBps"]
            + (r["planned_collectives"] * rates["collective_us"] + r["planned_groups"] * rates["group_us"]) / 1e3)


def main(argv=None):
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)  # `| head` ends the listing quietly
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("files", nargs="+", help="bench_collection JSON lines")
    ap.add_argument("--where", action="append", default=[], metavar="KEY=VALUE",
                    help="keep the records whose field KEY reads VALUE (repeatable)")
    ap.add_argument("--json", action="store_true", help="print the fit as one JSON object")
    a = ap.parse_args(argv)
    where = []
    for w in a.where:
        if "=" not in w:
            ap.exit(2, f"fit_planner: --where expects KEY=VALUE, found '{w}'\n")
        where.append(tuple(w.split("=", 1)))
    rows = load(a.files, where)
    if not rows:
        ap.exit(2, "fit_planner: no bench_collection record with the planner's terms (" + ", ".join(TERMS) +
                ") in " + " ".join(a.files) + (" matching " + " ".join(a.where) if a.where else "") + "\n")
    rates, fitted = fit(rows)
    was = planned_rates(rows)
    errs = [(estimate(r, rates) - r["ms_step"]) / r["ms_step"] for r in rows]
    mean_abs = float(np.mean(np.abs(errs)))
    if a.json:
        print(json.dumps({"rates": rates, "fitted": fitted, "records": len(rows), "mean_abs_error": mean_abs,
                          "max_abs_error": float(np.max(np.abs(errs)))}))
        return 0
    revs = sorted({str(r.get("git", "?"))[:7] for r in rows})
    gpus = sorted({g for r in rows for g in (r.get("gpus") or [r.get("backend", "?")])})
    print(f"fit_planner: {len(rows)} bench_collection records (revisions {' '.join(revs)}; devices {', '.join(gpus)})")
    for name in RATES:
        how = "fitted" if fitted[name] else "kept: no record gives this term weight"
        print(f"  {name:14s} {rates[name]:10.1f}   (planned with {was[name]:g}; {how})")
    within = sum(abs(e) <= 0.2 for e in errs)
    print(f"  mean |error| {100 * mean_abs:.1f}% (largest {100 * max(abs(e) for e in errs):.1f}%), "
          f"{within} of {len(rows)} within 20%")
    print(f"  {'placement':11s} {'index':6s} {'tables':9s} {'ranks':>5s} {'batch':>7s} | {'measured':>9s} "
          f"{'estimate':>9s} {'error':>7s}")
    for r, e in zip(rows, errs):
        print(f"  {str(r.get('placement')):11s} {str(r.get('index')):6s} {str(r.get('tables')):9s} "
              f"{r.get('ranks', 1):>5} {r.get('batch', 0):>7} | {r['ms_step']:9.3f} {estimate(r, rates):9.3f} "
              f"{100 * e:+6.1f}%")
    print("sparta-train: " + " ".join(f"{TRAIN_OPTIONS[n]} {rates[n]:.4g}" for n in RATES))
    print("bench_collection: " + " ".join(f"{BENCH_OPTIONS[n]} {rates[n]:.4g}" for n in RATES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
