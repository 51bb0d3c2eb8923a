"""Shared by the plot scripts: reading JSON lines (bench_*, sweeps, the trainer's metrics), filtering, grouping,
derived fields, and writing a figure (headless: matplotlib's Agg backend).

A bad file is an error naming it and the line: `sys.exit("plot_x: results.jsonl:12: not a JSON object (...)")`.
"""
import argparse
import json
import math
import os
import sys
from collections import OrderedDict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

PROG = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "plot"


def fail(msg):
    sys.exit(f"{PROG}: {msg}")


def parse_where(items):
    """--where KEY=VALUE ... into [(key, value)]; values compare as text."""
    out = []
    for w in items:
        if "=" not in w:
            fail(f"--where: expected KEY=VALUE, found '{w}'")
        k, v = w.split("=", 1)
        out.append((k, v))
    return out


def text(v):
    """How a field's value compares and prints: JSON booleans as true/false, numbers as written."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def read_jsonl(paths, where=()):
    """Every JSON object of the files (blank lines skipped) that matches every (key, value) of where."""
    rows = []
    for path in paths:
        try:
            f = open(path)
        except OSError as e:
            fail(f"{path}: cannot read ({e.strerror})")
        with f:
            for n, line in enumerate(f, 1):
                line = line.strip()
                if not line:
                    continue
                try:
                    rec = json.loads(line)
                except json.JSONDecodeError as e:
                    fail(f"{path}:{n}: not a JSON object ({e})")
                if not isinstance(rec, dict):
                    fail(f"{path}:{n}: expected a JSON object, found {type(rec).__name__}")
                if all(k in rec and text(rec[k]) == v for k, v in where):
                    rows.append(rec)
    return rows


def number(rec, key):
    """rec[key] as a float, or None when absent or not a number."""
    v = rec.get(key)
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return None
    return float(v)


def samples_per_s(rec):
    """Training throughput of a record: its samples_per_s, else (global) batch / step time."""
    v = number(rec, "samples_per_s")
    if v is not None:
        return v
    batch = number(rec, "global_batch") or number(rec, "batch")
    for key in ("step_ms", "ms_step", "ms"):
        ms = number(rec, key)
        if batch and ms:
            return batch / (ms / 1e3)
    return None


def value(rec, key):
    """A field, or a derived one: samples_per_s (see above), gpus (ranks)."""
    if key == "samples_per_s":
        return samples_per_s(rec)
    if key == "gpus":
        return number(rec, "gpus") or number(rec, "ranks")
    return number(rec, key)


def group_by(rows, keys):
    """OrderedDict: tuple of the keys' values (as text) -> records, groups in order of first appearance."""
    groups = OrderedDict()
    for r in rows:
        groups.setdefault(tuple(text(r.get(k, "")) for k in keys), []).append(r)
    return groups


def group_label(keys, values):
    return ", ".join(f"{k}={v}" for k, v in zip(keys, values)) if keys else ""


def split_keys(s):
    return [k for k in (s or "").split(",") if k]


def provenance_title(rows):
    """'host, GPU names, git abc1234' from the first record (bench_* and sweeps write these fields)."""
    if not rows:
        return ""
    first = rows[0]
    gpus = first.get("gpus") or []
    devices = ", ".join(gpus) if isinstance(gpus, list) and gpus else first.get("backend", "")
    git = str(first.get("git") or first.get("git_rev") or "")[:10]
    return " ".join(x for x in (str(first.get("host", "")), str(devices), f"git {git}" if git else "") if x)


def log_if_wide(ax, xs, ys, xbase=2):
    xs = [x for x in xs if x is not None]
    ys = [y for y in ys if y is not None]
    if xs and min(xs) > 0 and max(xs) / min(xs) >= 100:
        ax.set_xscale("log", base=xbase)
    if ys and min(ys) > 0 and max(ys) / min(ys) >= 100:
        ax.set_yscale("log")


def common_parser(description, out_default):
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("files", nargs="+", help="JSON-lines result files")
    p.add_argument("--where", action="append", default=[], metavar="KEY=VALUE", help="keep matching records")
    p.add_argument("--title", help="figure title (default: host, GPUs, git revision of the first record)")
    p.add_argument("--out", default=out_default, help=f"PNG to write (default {out_default})")
    return p


def require(rows, what, files):
    if not rows:
        fail(f"no record with {what} in {', '.join(files)}")
    return rows


def save(fig, path, note=""):
    d = os.path.dirname(path)
    if d:
        os.makedirs(d, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    print(f"wrote {path}" + (f" ({note})" if note else ""))


def nice_bytes(b):
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= f:
            v = b / f
            return f"{v:.0f} {unit}" if v == math.floor(v) else f"{v:.1f} {unit}"
    return f"{b:.0f} B"
