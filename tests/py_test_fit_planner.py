#!/usr/bin/env python3
"""experiments/fit_planner.py: rates recovered from step times made with known rates, the rates no record can tell
kept, the relative-error weighting, the records it skips and its errors. Run by test_experiments (make test)."""
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import fit_planner as fp  # noqa: E402

SCRIPT = os.path.join(ROOT, "experiments", "fit_planner.py")


def record(link_mb, local_mb, coll, groups, rates, **extra):
    """A bench_collection line whose step is the planner's estimate at rates (times 1 + noise)."""
    ms = (link_mb / rates["link_GBps"] + local_mb / rates["hbm_GBps"]
          + (coll * rates["collective_us"] + groups * rates["group_us"]) / 1e3)
    r = {"bench": "collection", "placement": "dispatch", "index": "direct", "tables": "custom", "ranks": 2,
         "batch": 64, "ms_step": ms, "MB_moved_planned": link_mb, "planned_local_MB": local_mb,
         "planned_collectives": coll, "planned_groups": groups, "planner_link_GBps": 600, "planner_hbm_GBps": 1600,
         "planner_collective_us": 100, "planner_group_us": 400}
    r.update(extra)
    return r


def random_terms(one_rank=False):
    groups = random.randint(1, 4)
    return (0.0 if one_rank else random.uniform(10, 500), random.uniform(100, 5000),
            0 if one_rank else groups * random.randint(3, 6), groups)


def run(args, lines):
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for l in lines:
            f.write((l if isinstance(l, str) else json.dumps(l)) + "\n")
    try:
        return subprocess.run([sys.executable, SCRIPT, f.name] + args, capture_output=True, text=True)
    finally:
        os.unlink(f.name)


class Fit(unittest.TestCase):
    def test_recovers_the_rates(self):
        truth = {"link_GBps": random.uniform(200, 900), "hbm_GBps": random.uniform(800, 4000),
                 "collective_us": random.uniform(20, 300), "group_us": random.uniform(50, 600)}
        rows = [record(*random_terms(one_rank=i < 4), truth) for i in range(16)]
        rates, fitted = fp.fit(rows)
        for name in fp.RATES:
            self.assertTrue(fitted[name], name)
            self.assertAlmostEqual(rates[name] / truth[name], 1.0, places=6, msg=name)
        for r in rows:
            self.assertAlmostEqual(fp.estimate(r, rates) / r["ms_step"], 1.0, places=6)

    def test_one_rank_keeps_the_link_and_collective_rates(self):
        truth = {"link_GBps": 1.0, "hbm_GBps": 2500.0, "collective_us": 1.0, "group_us": 90.0}
        rows = [record(*random_terms(one_rank=True), truth) for _ in range(8)]
        for r in rows:
            r["planner_link_GBps"], r["planner_collective_us"] = 321.0, 77.0
        rates, fitted = fp.fit(rows)
        self.assertFalse(fitted["link_GBps"])
        self.assertFalse(fitted["collective_us"])
        self.assertEqual(rates["link_GBps"], 321.0)  # what the records were planned with
        self.assertEqual(rates["collective_us"], 77.0)
        self.assertAlmostEqual(rates["hbm_GBps"], 2500.0, places=4)
        self.assertAlmostEqual(rates["group_us"], 90.0, places=6)

    def test_relative_error_and_no_negative_rate(self):
        # Two records with the same terms, one measured 10x longer: each counts by its relative error, so the
        # estimate e minimizes (e / 1 - 1)^2 + (e / 10 - 1)^2; no rate comes out negative.
        truth = {"link_GBps": 600, "hbm_GBps": 1000.0, "collective_us": 100, "group_us": 400}
        a = record(0, 1000, 0, 1, truth)
        b = record(0, 1000, 0, 1, truth)
        a["ms_step"], b["ms_step"] = 1.0, 10.0
        A, y = fp.design([a, b])
        x = fp.nnls_relative(A, y)
        self.assertIsNone(x[0])  # no link bytes: unconstrained
        self.assertGreaterEqual(min(v for v in x if v is not None), 0.0)
        rates, fitted = fp.fit([a, b])
        est = [fp.estimate(r, rates) for r in (a, b)]
        # least squares of (e/1 - 1, e/10 - 1): e = (1 + 0.1) / (1 + 0.01) = 1.0891
        self.assertAlmostEqual(est[0], 1.1 / 1.01, places=6)

    def test_command_prints_rates_points_and_options(self):
        truth = {"link_GBps": 450.0, "hbm_GBps": 2200.0, "collective_us": 150.0, "group_us": 250.0}
        lines = [record(*random_terms(), truth, placement=p) for p in ("dispatch", "replicated", "localized",
                                                                        "distributed", "hybrid", "plan")]
        lines += ["", json.dumps({"bench": "embedding", "ms": 1.0}),  # other benches and blank lines: skipped
                  json.dumps({"bench": "collection", "ms_step": 2.0, "MB_moved_planned": 1.0})]  # no terms: skipped
        r = run([], lines)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("6 bench_collection records", r.stdout)
        self.assertIn("--embedding.planner_link_gbps 450", r.stdout)
        self.assertIn("--planner-group-us 250", r.stdout)
        for p in ("distributed", "hybrid"):
            self.assertIn(p, r.stdout)
        j = run(["--json", "--where", "placement=hybrid", "--where", "placement=hybrid"], lines)
        self.assertEqual(j.returncode, 0, j.stderr)
        self.assertEqual(json.loads(j.stdout)["records"], 1)
        lines[0]["nodes"] = 1.0  # a whole float matches its integer text
        j = run(["--json", "--where", "nodes=1"], lines)
        self.assertEqual(j.returncode, 0, j.stderr)
        self.assertEqual(json.loads(j.stdout)["records"], 1)

    def test_errors(self):
        r = run([], [json.dumps({"bench": "collection", "ms_step": 2.0})])
        self.assertEqual(r.returncode, 2)
        self.assertIn("no bench_collection record with the planner's terms", r.stderr)
        r = run(["--where", "placement"], [json.dumps(record(1, 1, 3, 1, fp.DEFAULTS))])
        self.assertEqual(r.returncode, 2)
        self.assertIn("--where expects KEY=VALUE, found 'placement'", r.stderr)
        r = run(["--where", "index=hashed"], [json.dumps(record(1, 1, 3, 1, fp.DEFAULTS))])
        self.assertEqual(r.returncode, 2)
        self.assertIn("matching index=hashed", r.stderr)
        r = run([], ["{not json"])
        self.assertNotEqual(r.returncode, 0)
        self.assertIn(":1: not a JSON line", r.stderr)


if __name__ == "__main__":
    seed = int(os.environ.get("SPARTA_TEST_SEED", random.randrange(1 << 30)))
    print(f"seed {seed}")
    random.seed(seed)
    unittest.main(argv=sys.argv[:1], verbosity=1)
