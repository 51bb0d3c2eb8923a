#!/usr/bin/env python3
"""Analysis of a sparta checkpoint, read straight from its HDF5 files (format: README "Formats" and
io/checkpoint_format.h): rows per table and per shard, row-norm histograms, optimizer-state statistics, key
frequencies from a dataset file, and the difference between two checkpoints. A text summary on stdout, PNGs
in --out-dir, and everything as JSON with --json.

    plots/ckpt_analysis.py ckpt/                       # the step `latest` names
    plots/ckpt_analysis.py ckpt/step-200 --diff ckpt/step-100 --top-k 20 --out-dir figs/
    plots/ckpt_analysis.py ckpt/ --dataset train.h5 --slot-table 0=user,1=item --max-samples 1000000

Diff: rows are matched by key per table; a row moved when the L2 norm of (new - old) values exceeds --tol
(default 0: any change). Per table: rows in both, only in each, moved, max and mean L2 change over the rows in
both, and the top-k moved keys.
Key frequency: the dataset's keys of slot s (CSR rows sample * num_slots + s) belong to the table
--slot-table maps s to (default: slot i -> the checkpoint's i-th table when they have as many); per table, how
often each key occurs, how many distinct keys, and which share of them the checkpoint holds.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np

import results_io as rio

STATE_BLOCKS = {"adam": ["m", "v"], "lazy_adam": ["m", "v"], "adagrad": ["accumulator"],
                "momentum": ["velocity"], "nesterov": ["velocity"]}


def fail(msg):
    sys.exit(f"ckpt_analysis: {msg}")


def attr_text(v):
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    if isinstance(v, np.ndarray):
        return v.tolist()
    if isinstance(v, np.generic):
        return v.item()
    return v


def step_dir(path):
    """A step directory: path itself, or the one path/latest names."""
    if os.path.isfile(os.path.join(path, "manifest.h5")):
        return path
    latest = os.path.join(path, "latest")
    if os.path.isfile(latest):
        with open(latest) as f:
            name = f.read().strip()
        d = os.path.join(path, name)
        if not os.path.isfile(os.path.join(d, "manifest.h5")):
            fail(f"{latest} names '{name}', but {d}/manifest.h5 does not exist")
        return d
    fail(f"{path}: expected a checkpoint step directory (with manifest.h5) or a root with a 'latest' file")


def open_h5(path):
    try:
        return h5py.File(path, "r")
    except OSError as e:
        fail(f"{path}: cannot open as HDF5 ({e})")


def stored_values(grp, where):
    """A table group's values as float32: float32 as stored, or (attribute storage bf16 / fp16) uint16 bits
    widened exactly (bf16: the high half of a float32; fp16: IEEE half)."""
    storage = attr_text(grp.attrs["storage"]) if "storage" in grp.attrs else "fp32"
    v = grp["values"][...]
    if storage == "fp32":
        return v
    if v.dtype != np.uint16:
        fail(f"{where}: values: storage {storage} needs uint16 bits, found {v.dtype}")
    if storage == "bf16":
        return (v.astype(np.uint32) << 16).view(np.float32)
    if storage == "fp16":
        return v.view(np.float16).astype(np.float32)
    fail(f"{where}: attribute storage: expected fp32, bf16 or fp16, found '{storage}'")


def load_checkpoint(path):
    """{'dir', 'meta': manifest attributes, 'tables': [{name, dim, optimizer, state_width, rows, shard_rows,
    keys, values, state, shard_of_row}]} with every shard's rows concatenated in shard order."""
    d = step_dir(path)
    with open_h5(os.path.join(d, "manifest.h5")) as m:
        meta = {k: attr_text(v) for k, v in m.attrs.items()}
        if meta.get("format") != "sparta-checkpoint":
            fail(f"{d}/manifest.h5: attribute format: expected 'sparta-checkpoint', found {meta.get('format')!r}")
        world = int(meta["world_size"])
        tables = []
        for i in range(int(meta["num_tables"])):
            g = m[f"tables/{i}"]
            t = {k: attr_text(v) for k, v in g.attrs.items()}
            t["shard_rows_manifest"] = [int(x) for x in np.atleast_1d(t.get("shard_rows", []))]
            tables.append(t)
    for t in tables:
        keys, values, state, shard_of = [], [], [], []
        t["shard_rows"] = []
        for r in range(world):
            sp = os.path.join(d, f"shard-{r}-of-{world}.h5")
            with open_h5(sp) as s:
                grp = s.get(f"tables/{t['name']}")
                if grp is None:
                    fail(f"{sp}: group tables/{t['name']} is missing")
                k = grp["keys"][...]
                v = stored_values(grp, f"{sp}: tables/{t['name']}")
                st = grp["state"][...] if "state" in grp else np.zeros((len(k), 0), np.float32)
                if v.shape != (len(k), int(t["dim"])):
                    fail(f"{sp}: tables/{t['name']}/values: expected shape ({len(k)}, {t['dim']}), found {v.shape}")
            keys.append(k)
            values.append(v)
            state.append(st)
            shard_of.append(np.full(len(k), r, np.int32))
            t["shard_rows"].append(int(len(k)))
        t["keys"] = np.concatenate(keys) if keys else np.zeros(0, np.int64)
        t["values"] = np.concatenate(values) if values else np.zeros((0, int(t["dim"])), np.float32)
        t["state"] = np.concatenate(state) if state else np.zeros((0, 0), np.float32)
        t["shard_of_row"] = np.concatenate(shard_of) if shard_of else np.zeros(0, np.int32)
    return {"dir": d, "meta": meta, "tables": tables}


def stats(x):
    x = np.asarray(x, dtype=np.float64).ravel()
    if x.size == 0:
        return {"count": 0}
    return {"count": int(x.size), "min": float(x.min()), "max": float(x.max()), "mean": float(x.mean()),
            "std": float(x.std()), "mean_abs": float(np.abs(x).mean()), "zero_fraction": float((x == 0).mean()),
            "p50": float(np.percentile(x, 50)), "p99": float(np.percentile(x, 99))}


def state_blocks(t):
    """[(name, columns)] of the optimizer state: blocks of dim columns named after the optimizer."""
    width, dim = int(t["state_width"]), int(t["dim"])
    if width == 0:
        return []
    names = STATE_BLOCKS.get(str(t["optimizer"]), [])
    if dim > 0 and width % dim == 0 and len(names) == width // dim:
        return [(n, slice(i * dim, (i + 1) * dim)) for i, n in enumerate(names)]
    if dim > 0 and width % dim == 0:
        return [(f"state[{i}]", slice(i * dim, (i + 1) * dim)) for i in range(width // dim)]
    return [("state", slice(0, width))]


def table_summary(t):
    norms = np.linalg.norm(t["values"].astype(np.float64), axis=1) if len(t["keys"]) else np.zeros(0)
    s = {"name": t["name"], "dim": int(t["dim"]), "optimizer": t["optimizer"], "state_width": int(t["state_width"]),
         "rows": int(len(t["keys"])), "rows_manifest": int(t["rows"]), "shard_rows": t["shard_rows"],
         "shard_rows_manifest": t["shard_rows_manifest"], "distinct_keys": int(len(np.unique(t["keys"]))),
         "row_norm": stats(norms), "values": stats(t["values"]),
         "state": {name: stats(t["state"][:, cols]) for name, cols in state_blocks(t)}}
    return s, norms


def diff_tables(a, b, top_k, tol):
    """Rows of table a and table b matched by key: counts, L2 changes, top-k moved keys."""
    ka, kb = a["keys"], b["keys"]
    common, ia, ib = np.intersect1d(ka, kb, assume_unique=False, return_indices=True)
    out = {"name": a["name"], "rows_a": int(len(ka)), "rows_b": int(len(kb)), "in_both": int(len(common)),
           "only_a": int(len(np.setdiff1d(ka, kb))), "only_b": int(len(np.setdiff1d(kb, ka)))}
    if a["dim"] != b["dim"]:
        out["error"] = f"dim {a['dim']} against {b['dim']}: values not compared"
        return out, np.zeros(0)
    change = np.linalg.norm(b["values"][ib].astype(np.float64) - a["values"][ia].astype(np.float64), axis=1)
    moved = change > tol
    out.update(moved=int(moved.sum()), unchanged=int((~moved).sum()),
               max_l2_change=float(change.max()) if len(change) else 0.0,
               mean_l2_change=float(change.mean()) if len(change) else 0.0,
               mean_l2_change_of_moved=float(change[moved].mean()) if moved.any() else 0.0)
    order = np.argsort(-change, kind="stable")[:top_k]
    out["top_moved"] = [{"key": int(common[i]), "l2_change": float(change[i])} for i in order if moved[i]]
    return out, change


def read_key_counts(path, slot_table, table_names, max_samples):
    """{table: (unique keys, counts)} from a dataset file's CSR keys."""
    with open_h5(path) as f:
        if rio.text(attr_text(f.attrs.get("format", ""))) != "sparta-dataset":
            fail(f"{path}: attribute format: expected 'sparta-dataset', found {attr_text(f.attrs.get('format'))!r}")
        slots = int(f.attrs["num_slots"])
        n = int(f.attrs["num_samples"])
        if max_samples:
            n = min(n, max_samples)
        offsets = f["sparse/offsets"][: n * slots + 1]
        keys = f["sparse/keys"][: int(offsets[-1])]
    if slot_table is None:
        if slots != len(table_names):
            return None, (f"the dataset has {slots} slots and the checkpoint {len(table_names)} tables: say which "
                          f"table each slot feeds with --slot-table")
        slot_table = {i: name for i, name in enumerate(table_names)}
    for s, name in slot_table.items():
        if s < 0 or s >= slots:
            fail(f"--slot-table: slot {s} is not in the dataset's 0..{slots - 1}")
        if name not in table_names:
            fail(f"--slot-table: table '{name}' is not in the checkpoint ({', '.join(table_names)})")
    lengths = np.diff(offsets)
    slot_of_key = np.repeat(np.tile(np.arange(slots), n), lengths)
    out = {}
    for name in table_names:
        mine = [s for s, t in slot_table.items() if t == name]
        if not mine:
            continue
        k = keys[np.isin(slot_of_key, mine)]
        out[name] = np.unique(k, return_counts=True)
    return out, ""


def parse_slot_table(s):
    if not s:
        return None
    out = {}
    for item in s.split(","):
        if "=" not in item:
            fail(f"--slot-table: expected SLOT=TABLE,..., found '{item}'")
        slot, name = item.split("=", 1)
        try:
            out[int(slot)] = name
        except ValueError:
            fail(f"--slot-table: slot '{slot}' is not an integer")
    return out


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", help="a checkpoint root (its latest step) or a step directory")
    p.add_argument("--diff", metavar="OTHER", help="an earlier checkpoint to compare with (the old side)")
    p.add_argument("--dataset", help="a dataset file: key frequencies per table")
    p.add_argument("--slot-table", help="SLOT=TABLE,... which table each dataset slot feeds")
    p.add_argument("--max-samples", type=int, default=0, help="read at most this many samples of --dataset")
    p.add_argument("--top-k", type=int, default=10)
    p.add_argument("--tol", type=float, default=0.0, help="L2 change above which a row counts as moved")
    p.add_argument("--bins", type=int, default=50)
    p.add_argument("--out-dir", default="ckpt_analysis", help="PNGs go here")
    p.add_argument("--json", help="write the whole summary as JSON here")
    a = p.parse_args()
    import matplotlib.pyplot as plt  # after results_io chose the Agg backend

    ck = load_checkpoint(a.checkpoint)
    meta = ck["meta"]
    summary = {"checkpoint": ck["dir"], "step": meta.get("step"), "world_size": meta.get("world_size"),
               "plan": meta.get("plan"), "config": meta.get("config"), "tables": [], "figures": []}
    print(f"checkpoint {ck['dir']}: step {meta.get('step')}, written by {meta.get('world_size')} rank(s), "
          f"plan '{meta.get('plan', '')}'")
    norms = {}
    for t in ck["tables"]:
        s, norms[t["name"]] = table_summary(t)
        summary["tables"].append(s)
        flag = "" if s["rows"] == s["rows_manifest"] and s["shard_rows"] == s["shard_rows_manifest"] else \
            f"  (MANIFEST SAYS {s['rows_manifest']} rows, shards {s['shard_rows_manifest']})"
        print(f"table {s['name']}: dim {s['dim']}, {s['optimizer']} (state {s['state_width']}), {s['rows']} rows "
              f"({s['distinct_keys']} distinct keys), per shard {s['shard_rows']}{flag}")
        rn = s["row_norm"]
        if rn["count"]:
            print(f"  row L2 norm: min {rn['min']:.4g} mean {rn['mean']:.4g} p99 {rn['p99']:.4g} max {rn['max']:.4g}")
        for name, st in s["state"].items():
            if st["count"]:
                print(f"  state {name}: mean {st['mean']:.4g} std {st['std']:.4g} min {st['min']:.4g} "
                      f"max {st['max']:.4g} zero {100 * st['zero_fraction']:.1f}%")
    os.makedirs(a.out_dir, exist_ok=True)

    def save(fig, name):
        path = os.path.join(a.out_dir, name)
        rio.save(fig, path)
        summary["figures"].append(path)

    tables = ck["tables"]
    world = len(tables[0]["shard_rows"]) if tables else 0
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * world + 3), 4.2))
    bottom = np.zeros(world)
    for t in tables:
        ax.bar(np.arange(world), t["shard_rows"], 0.7, bottom=bottom, label=t["name"])
        bottom += np.asarray(t["shard_rows"], dtype=float)
    ax.set_xlabel("shard (rank that wrote it)")
    ax.set_ylabel("rows")
    ax.set_xticks(np.arange(world))
    ax.legend(fontsize=8)
    ax.set_title(f"rows per shard, step {meta.get('step')}", fontsize=10)
    save(fig, "rows_per_shard.png")

    fig, ax = plt.subplots(figsize=(7, 4.2))
    for name, n in norms.items():
        if len(n):
            ax.hist(n, bins=a.bins, histtype="step", label=name)
    ax.set_xlabel("row L2 norm")
    ax.set_ylabel("rows")
    ax.legend(fontsize=8)
    ax.set_title("row norms", fontsize=10)
    save(fig, "row_norms.png")

    with_state = [t for t in tables if state_blocks(t) and len(t["keys"])]
    if with_state:
        fig, axes = plt.subplots(1, len(with_state), figsize=(6 * len(with_state), 4.2), squeeze=False)
        for ax, t in zip(axes[0], with_state):
            for name, cols in state_blocks(t):
                ax.hist(t["state"][:, cols].ravel(), bins=a.bins, histtype="step", label=name)
            ax.set_xlabel("optimizer state value")
            ax.set_ylabel("entries")
            ax.set_yscale("log")
            ax.legend(fontsize=8)
            ax.set_title(f"{t['name']}: {t['optimizer']} state", fontsize=10)
        save(fig, "optimizer_state.png")

    if a.dataset:
        counts, why = read_key_counts(a.dataset, parse_slot_table(a.slot_table), [t["name"] for t in tables],
                                      a.max_samples)
        if counts is None:
            fail(f"--dataset {a.dataset}: {why}")
        summary["key_frequency"] = {}
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for t in tables:
            if t["name"] not in counts:
                continue
            keys, c = counts[t["name"]]
            held = np.isin(keys, t["keys"])
            f = {"lookups": int(c.sum()), "distinct_keys": int(len(keys)), "max_count": int(c.max()) if len(c) else 0,
                 "distinct_keys_in_checkpoint": int(held.sum()),
                 "lookups_of_keys_in_checkpoint": int(c[held].sum()),
                 "checkpoint_rows_never_seen": int(len(t["keys"]) - held.sum())}
            summary["key_frequency"][t["name"]] = f
            print(f"key frequency {t['name']}: {f['lookups']} lookups of {f['distinct_keys']} distinct keys "
                  f"(most frequent {f['max_count']}x); {f['distinct_keys_in_checkpoint']} of them in the checkpoint, "
                  f"{f['checkpoint_rows_never_seen']} checkpoint rows not in the data")
            if len(c):
                ranked = np.sort(c)[::-1]
                ax1.loglog(np.arange(1, len(ranked) + 1), ranked, label=t["name"])
                ax2.hist(c, bins=np.unique(np.logspace(0, np.log10(max(2, c.max())), a.bins).astype(int)),
                         histtype="step", label=t["name"])
        ax1.set_xlabel("key rank (most frequent first)")
        ax1.set_ylabel("occurrences in the dataset")
        ax2.set_xscale("log")
        ax2.set_yscale("log")
        ax2.set_xlabel("occurrences of a key")
        ax2.set_ylabel("distinct keys")
        for ax in (ax1, ax2):
            ax.legend(fontsize=8)
        ax1.set_title("rank-frequency", fontsize=10)
        ax2.set_title("key frequency histogram", fontsize=10)
        save(fig, "key_frequency.png")

    if a.diff:
        old = load_checkpoint(a.diff)
        summary["diff"] = {"old": old["dir"], "old_step": old["meta"].get("step"), "tables": []}
        print(f"diff against {old['dir']} (step {old['meta'].get('step')}): L2 change of rows matched by key")
        by_name = {t["name"]: t for t in old["tables"]}
        changes = {}
        for t in tables:
            if t["name"] not in by_name:
                summary["diff"]["tables"].append({"name": t["name"], "error": "not in the old checkpoint"})
                print(f"  table {t['name']}: not in the old checkpoint")
                continue
            d, changes[t["name"]] = diff_tables(by_name[t["name"]], t, a.top_k, a.tol)
            summary["diff"]["tables"].append(d)
            if "error" in d:
                print(f"  table {t['name']}: {d['error']}")
                continue
            print(f"  table {t['name']}: {d['in_both']} rows in both ({d['only_a']} only old, {d['only_b']} only new); "
                  f"{d['moved']} moved, max L2 change {d['max_l2_change']:.4g}, mean {d['mean_l2_change']:.4g}")
            for m in d["top_moved"]:
                print(f"    key {m['key']}: {m['l2_change']:.4g}")
        for name in by_name:
            if name not in {t["name"] for t in tables}:
                summary["diff"]["tables"].append({"name": name, "error": "not in the new checkpoint"})
                print(f"  table {name}: not in the new checkpoint")
        fig, ax = plt.subplots(figsize=(7, 4.2))
        for name, ch in changes.items():
            if len(ch):
                ax.hist(ch, bins=a.bins, histtype="step", label=name)
        ax.set_xlabel("L2 change of a row")
        ax.set_ylabel("rows")
        ax.legend(fontsize=8)
        ax.set_title(f"step {old['meta'].get('step')} -> {meta.get('step')}", fontsize=10)
        save(fig, "diff.png")

    if a.json:
        with open(a.json, "w") as f:
            json.dump(summary, f, indent=1)
        print(f"wrote {a.json}")


if __name__ == "__main__":
    main()
