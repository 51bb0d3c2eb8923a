#!/usr/bin/env python3
"""plots/ckpt_analysis.py on checkpoints written by tests/tool_ckpt_writer (2 steps, W ranks, N rows per rank
and table) and on a dataset written here: row counts against the tool's contract (rank r holds g = i*W + r,
key 4g + 1), statistics and the diff against values read here with h5py, key frequencies against counts made
here. Needs SPARTA_TOOLS (build/tests) and SPARTA_MPIEXEC; run by test_experiments (make test)."""
import json
import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import unittest

import h5py
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOOLS = os.environ.get("SPARTA_TOOLS", os.path.join(ROOT, "build", "tests"))
MPIEXEC = os.environ.get("SPARTA_MPIEXEC", "mpiexec")


def shard_table(root, step, world, name):
    """Keys and values of a table over the shards; bf16 values (the tool writes table item so: uint16 bits, the
    group's attribute storage) as float32, the bits in the high half."""
    keys, values = [], []
    for r in range(world):
        with h5py.File(os.path.join(root, f"step-{step}", f"shard-{r}-of-{world}.h5"), "r") as f:
            keys.append(f[f"tables/{name}/keys"][...])
            v = f[f"tables/{name}/values"][...]
            storage = f[f"tables/{name}"].attrs.get("storage", b"fp32")
            if storage in (b"bf16", "bf16"):
                assert v.dtype == np.uint16, v.dtype
                v = (v.astype(np.uint32) << 16).view(np.float32)
            values.append(v)
    return np.concatenate(keys), np.concatenate(values)


class CkptAnalysis(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sparta_py_test_ckpt_")
        cls.world = random.randint(1, 2)
        cls.rows = random.randint(30, 300)
        cls.root = os.path.join(cls.dir, "ckpt")
        cmd = (shlex.split(MPIEXEC) + ["-n", str(cls.world), os.path.join(TOOLS, "tool_ckpt_writer"), "write", cls.root,
                                       "--steps", "2", "--rows", str(cls.rows), "--seed", str(random.randint(1, 1 << 30))])
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if r.returncode != 0:
            raise RuntimeError(f"{shlex.join(cmd)}: exit {r.returncode}\n{r.stdout}{r.stderr}")
        # A dataset with two slots: slot 0 feeds "user", slot 1 "item"; keys drawn from the checkpoint's keys
        # (4g + 1) and from keys it does not hold (even numbers).
        cls.total = cls.rows * cls.world
        n = 500
        rng = np.random.default_rng()
        per = rng.integers(0, 4, size=2 * n)
        offsets = np.concatenate([[0], np.cumsum(per)]).astype(np.int64)
        held = 4 * rng.integers(0, cls.total, size=int(offsets[-1])) + 1
        absent = 2 * rng.integers(0, cls.total, size=int(offsets[-1]))
        keys = np.where(rng.random(int(offsets[-1])) < 0.8, held, absent).astype(np.int64)
        cls.data = os.path.join(cls.dir, "data.h5")
        with h5py.File(cls.data, "w") as f:
            f.attrs["format"] = "sparta-dataset"
            f.attrs["version"] = 1
            f.attrs["num_samples"] = n
            f.attrs["num_dense"] = 1
            f.attrs["num_slots"] = 2
            f.create_dataset("label", data=np.zeros(n, np.float32))
            f.create_dataset("dense", data=np.zeros((n, 1), np.float32))
            f.create_dataset("sparse/offsets", data=offsets)
            f.create_dataset("sparse/keys", data=keys)
        slot = np.repeat(np.tile([0, 1], n), per)
        cls.expect_freq = {}
        for s, name in enumerate(("user", "item")):
            k = keys[slot == s]
            u, c = np.unique(k, return_counts=True)
            inside = (u % 4 == 1) & (u < 4 * cls.total)
            cls.expect_freq[name] = {"lookups": int(len(k)), "distinct_keys": int(len(u)),
                                     "distinct_keys_in_checkpoint": int(inside.sum()),
                                     "lookups_of_keys_in_checkpoint": int(c[inside].sum()),
                                     "checkpoint_rows_never_seen": int(cls.total - inside.sum())}
        cls.figs = os.path.join(cls.dir, "figs")
        cls.summary = os.path.join(cls.dir, "summary.json")
        cmd = [sys.executable, os.path.join(ROOT, "plots", "ckpt_analysis.py"), cls.root, "--diff",
               os.path.join(cls.root, "step-1"), "--dataset", cls.data, "--slot-table", "0=user,1=item",
               "--top-k", "5", "--out-dir", cls.figs, "--json", cls.summary]
        cls.run_result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        if cls.run_result.returncode != 0:
            raise RuntimeError(f"ckpt_analysis: exit {cls.run_result.returncode}\n{cls.run_result.stdout}"
                               f"{cls.run_result.stderr}")
        with open(cls.summary) as f:
            cls.s = json.load(f)

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.dir, ignore_errors=True)

    def test_rows_per_table_and_shard(self):
        self.assertEqual(self.s["step"], 2)  # `latest` names the last step
        self.assertEqual(self.s["world_size"], self.world)
        tables = {t["name"]: t for t in self.s["tables"]}
        self.assertEqual(set(tables), {"user", "item"})
        for name, dim, opt, width in (("user", 32, "adam", 64), ("item", 8, "sgd", 0)):
            t = tables[name]
            self.assertEqual((t["dim"], t["optimizer"], t["state_width"]), (dim, opt, width))
            self.assertEqual(t["rows"], self.total)
            self.assertEqual(t["shard_rows"], [self.rows] * self.world)
            self.assertEqual(t["distinct_keys"], self.total)
            keys, values = shard_table(self.root, 2, self.world, name)
            self.assertEqual(sorted(keys.tolist()), [4 * g + 1 for g in range(self.total)])
            norms = np.linalg.norm(values.astype(np.float64), axis=1)
            self.assertAlmostEqual(t["row_norm"]["max"], norms.max(), places=6)
            self.assertAlmostEqual(t["row_norm"]["mean"], norms.mean(), places=6)

    def test_optimizer_state_statistics(self):
        user = next(t for t in self.s["tables"] if t["name"] == "user")
        self.assertEqual(sorted(user["state"]), ["m", "v"])
        states = []
        for r in range(self.world):
            with h5py.File(os.path.join(self.root, "step-2", f"shard-{r}-of-{self.world}.h5"), "r") as f:
                states.append(f["tables/user/state"][...])
        st = np.concatenate(states).astype(np.float64)
        for name, cols in (("m", slice(0, 32)), ("v", slice(32, 64))):
            self.assertEqual(user["state"][name]["count"], self.total * 32)
            self.assertAlmostEqual(user["state"][name]["mean"], st[:, cols].mean(), places=6)
            self.assertAlmostEqual(user["state"][name]["max"], st[:, cols].max(), places=6)
        item = next(t for t in self.s["tables"] if t["name"] == "item")
        self.assertEqual(item["state"], {})

    def test_diff_of_two_steps(self):
        d = {t["name"]: t for t in self.s["diff"]["tables"]}
        self.assertEqual(self.s["diff"]["old_step"], 1)
        for name in ("user", "item"):
            k1, v1 = shard_table(self.root, 1, self.world, name)
            k2, v2 = shard_table(self.root, 2, self.world, name)
            change = np.linalg.norm(v2[np.argsort(k2)].astype(np.float64) - v1[np.argsort(k1)].astype(np.float64),
                                    axis=1)
            t = d[name]
            self.assertEqual((t["in_both"], t["only_a"], t["only_b"]), (self.total, 0, 0))
            self.assertEqual(t["moved"], int((change > 0).sum()))
            self.assertAlmostEqual(t["max_l2_change"], change.max(), places=5)
            self.assertAlmostEqual(t["mean_l2_change"], change.mean(), places=5)
            top = [m["l2_change"] for m in t["top_moved"]]
            self.assertEqual(len(top), min(5, t["moved"]))
            self.assertEqual(top, sorted(top, reverse=True))
            sorted_keys = np.sort(k1)
            self.assertAlmostEqual(top[0], change.max(), places=5)
            self.assertEqual(t["top_moved"][0]["key"], int(sorted_keys[int(np.argmax(change))]))

    def test_diff_with_itself_moves_nothing(self):
        out = os.path.join(self.dir, "same.json")
        r = subprocess.run([sys.executable, os.path.join(ROOT, "plots", "ckpt_analysis.py"),
                            os.path.join(self.root, "step-1"), "--diff", os.path.join(self.root, "step-1"),
                            "--out-dir", os.path.join(self.dir, "same"), "--json", out], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            s = json.load(f)
        for t in s["diff"]["tables"]:
            self.assertEqual((t["moved"], t["max_l2_change"], t["top_moved"]), (0, 0.0, []))

    def test_key_frequency(self):
        for name, want in self.expect_freq.items():
            got = self.s["key_frequency"][name]
            for k, v in want.items():
                self.assertEqual(got[k], v, f"{name}.{k}")

    def test_figures(self):
        for png in ("rows_per_shard.png", "row_norms.png", "optimizer_state.png", "key_frequency.png", "diff.png"):
            path = os.path.join(self.figs, png)
            self.assertTrue(os.path.isfile(path) and os.path.getsize(path) > 1000, path)

    def test_not_a_checkpoint_is_an_error(self):
        r = subprocess.run([sys.executable, os.path.join(ROOT, "plots", "ckpt_analysis.py"), self.dir],
                           capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("manifest.h5", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
