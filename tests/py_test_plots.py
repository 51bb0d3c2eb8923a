#!/usr/bin/env python3
"""plots/: the shared module's computations against hand-computed values, and every plot script on records
written here (placements, breakdown, training curves, throughput, scaling: figures whose producers, the
collection and the trainer, are not there yet). Run by test_experiments (make test)."""
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "plots"))
import plot_scaling  # noqa: E402
import results_io as rio  # noqa: E402


def run(script, *args):
    return subprocess.run([sys.executable, os.path.join(ROOT, "plots", script), *args], capture_output=True, text=True,
                          timeout=120)


class Computations(unittest.TestCase):
    def test_efficiency_against_the_smallest_count(self):
        # T(1) = 100, T(2) = 180, T(4) = 300: E = 180 / 200, 300 / 400; a repeat keeps the best
        eff = plot_scaling.efficiency([(2, 170.0), (1, 100.0), (4, 300.0), (2, 180.0)])
        self.assertEqual([n for n, _ in eff], [1, 2, 4])
        for (_, got), want in zip(eff, [1.0, 0.9, 0.75]):
            self.assertAlmostEqual(got, want)

    def test_scaling_sets_strong_and_weak(self):
        rows = [{"ranks": 1, "batch": 1024, "samples_per_s": 10.0}, {"ranks": 2, "batch": 1024, "samples_per_s": 18.0},
                {"ranks": 2, "batch": 2048, "samples_per_s": 19.0}]
        sets = plot_scaling.scaling_sets(rows, "samples_per_s", batch_per_gpu=False)
        self.assertEqual(sets[("strong", 1024.0)], [(1.0, 10.0), (2.0, 18.0)])
        self.assertEqual(sets[("weak", 1024.0)], [(1.0, 10.0), (2.0, 19.0)])
        self.assertNotIn(("strong", 2048.0), sets)  # one GPU count only

    def test_derived_throughput(self):
        b, ms = random.randint(1, 1 << 16), random.uniform(0.5, 50)
        self.assertAlmostEqual(rio.samples_per_s({"batch": b, "step_ms": ms}), b / (ms / 1e3))
        self.assertAlmostEqual(rio.samples_per_s({"global_batch": b, "batch": 1, "ms_step": ms}), b / (ms / 1e3))
        self.assertEqual(rio.samples_per_s({"samples_per_s": 7, "batch": 1, "step_ms": 1}), 7.0)
        self.assertIsNone(rio.samples_per_s({"batch": 4}))

    def test_group_by_keeps_first_appearance_order(self):
        rows = [{"p": "b", "n": 1}, {"p": "a", "n": 2}, {"p": "b", "n": 3}, {"n": 4}]
        g = rio.group_by(rows, ["p"])
        self.assertEqual(list(g), [("b",), ("a",), ("",)])
        self.assertEqual([r["n"] for r in g[("b",)]], [1, 3])

    def test_where_compares_text(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "r.jsonl")
            with open(path, "w") as f:
                f.write('{"a": 1, "s": true}\n\n{"a": 2.0, "s": false}\n')
            self.assertEqual(len(rio.read_jsonl([path], [("a", "2")])), 1)
            self.assertEqual(len(rio.read_jsonl([path], [("s", "true")])), 1)

    def test_bad_line_names_file_and_line(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "bad.jsonl")
            with open(path, "w") as f:
                f.write('{"ranks": 1, "samples_per_s": 1}\n{"ranks": 2,\n')
            r = run("plot_scaling.py", path, "--out", os.path.join(d, "x.png"))
            self.assertNotEqual(r.returncode, 0)
            self.assertIn("bad.jsonl:2", r.stderr)
            self.assertFalse(os.path.exists(os.path.join(d, "x.png")))


class Figures(unittest.TestCase):
    """Each script writes a non-empty PNG from records shaped like the trainer's."""

    @classmethod
    def setUpClass(cls):
        cls.dir = tempfile.mkdtemp(prefix="sparta_py_test_plots_")
        rng = random.Random()
        cls.train = os.path.join(cls.dir, "train.jsonl")
        with open(cls.train, "w") as f:
            for placement in ("dispatch", "localized", "hybrid"):
                for ranks in (1, 2, 4):
                    for batch in (4096, 8192):  # global batch: strong sets; batch / ranks: weak sets
                        parts = {k: rng.uniform(0.1, 3) for k in ("ms_embedding", "ms_dense", "ms_comm", "ms_data")}
                        step = sum(parts.values()) + rng.uniform(0, 0.5)
                        f.write(json.dumps(dict(parts, placement=placement, ranks=ranks, nodes=1, batch=batch,
                                                global_batch=batch, ms_step=step, host="h", gpus=["G"])) + "\n")
        cls.metrics = os.path.join(cls.dir, "metrics.jsonl")
        with open(cls.metrics, "w") as f:
            for step in range(0, 200, 10):
                f.write(json.dumps({"step": step, "split": "train", "loss": 0.7 - step / 1000}) + "\n")
                if step % 50 == 0:
                    f.write(json.dumps({"step": step, "split": "eval", "loss": 0.69 - step / 1100,
                                        "auc": 0.5 + step / 1000}) + "\n")

    def check_png(self, script, *args):
        out = os.path.join(self.dir, script.replace(".py", ".png"))
        if os.path.exists(out):
            os.remove(out)
        r = run(script, *args, "--out", out)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertTrue(os.path.getsize(out) > 1000, f"{out}: {os.path.getsize(out)} bytes")
        with open(out, "rb") as f:
            self.assertEqual(f.read(8), b"\x89PNG\r\n\x1a\n")

    def test_placements(self):
        self.check_png("plot_placements.py", self.train)

    def test_breakdown(self):
        self.check_png("plot_breakdown.py", self.train, "--where", "ranks=2")

    def test_training(self):
        self.check_png("plot_training.py", self.metrics)

    def test_throughput(self):
        self.check_png("plot_throughput.py", self.train, "--group", "placement,ranks")

    def test_scaling(self):
        self.check_png("plot_scaling.py", self.train)

    def test_no_matching_record_is_an_error(self):
        r = run("plot_breakdown.py", self.train, "--where", "placement=none", "--out", os.path.join(self.dir, "n.png"))
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("no record", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
