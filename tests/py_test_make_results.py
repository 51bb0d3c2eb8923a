"""experiments/make_results.py on a visit made up here, with figures computed by hand: the measured files' names,
the archive move, the tables' medians and ratios, the dense part's share of the tensor rate, the tests' closing
line, the refusal of mixed revisions. Run by tests/test_measured_files (make test) from the repository root."""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.getcwd()
SCRIPT = os.path.join(ROOT, "experiments", "make_results.py")
REV = "0123456789abcdef0123456789abcdef01234567"
DOT_SHAPE = "dot, bottom MLP 13-512-256-128, 26 x 128 embeddings, top MLP 479-1024-1024-512-256-1, bf16"


def train(model, ranks, sps, ms_dense, rev=REV, tag="rep1"):
    return {"program": "bench_train", "bench": "train", "model": model, "ranks": ranks, "precision": "bf16",
            "batch_per_rank": 65536, "samples_per_s": sps, "ms_step": 65536 * ranks / sps * 1e3,
            "ms_dense": ms_dense, "hotness": "1", "model_shape": DOT_SHAPE, "tag": tag, "git": rev, "alpha": 0,
            "gpus": ["NVIDIA H200"], "date": "2026-11-28T20:00:00Z"}


def results_md(repo):
    with open(os.path.join(repo, "experiments", "RESULTS.md")) as f:
        return f.read()


class MakeResults(unittest.TestCase):
    def visit(self, records, peers, tests_log=None, extra=None):
        d = tempfile.mkdtemp()
        self.addCleanup(shutil.rmtree, d, True)
        out, repo = os.path.join(d, "out"), os.path.join(d, "repo")
        os.makedirs(out)
        os.makedirs(os.path.join(repo, "experiments", "measured"))
        os.makedirs(os.path.join(repo, "plots"))
        for f in os.listdir(os.path.join(ROOT, "plots")):
            if f.endswith(".py"):
                os.symlink(os.path.join(ROOT, "plots", f), os.path.join(repo, "plots", f))
        with open(os.path.join(out, "bench.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)
        with open(os.path.join(out, "peers.jsonl"), "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in peers)
        if tests_log:
            with open(os.path.join(out, "tests.log"), "w") as f:
                f.write(tests_log)
        for name, text in (extra or {}).items():
            with open(os.path.join(out, name), "w") as f:
                f.write(text)
        old = os.path.join(repo, "experiments", "measured", "h200_fedcba9_train.jsonl")
        with open(old, "w") as f:
            f.write("{}\n")
        r = subprocess.run([sys.executable, SCRIPT, out, "--repo", repo], capture_output=True, text=True)
        return r, repo

    def test_tables_files_and_ratios(self):
        recs = [train("dot", 1, 10e6, 2.0), train("dot", 1, 12e6, 2.0, tag="rep2"), train("dot", 2, 20e6, 2.0),
                dict(train("dot", 1, 14e6, 2.0, tag="direct1"), index="direct"),
                # tables in host memory or beyond the 4M cap are not the table's shape: left out, and their keys'
                # law out of the table's text
                dict(train("dot", 1, 99e6, 2.0, tag="full_host"), tier="host", max_rows=40000000, cache_gb=4.0,
                     alpha=1.1)]
        peers = [{"peer": "torch.dlrm.tbe.compiled", "model": "dot", "precision": "bf16", "batch": 65536,
                  "samples_per_s": 4e6},
                 {"peer": "torch.dlrm", "model": "dot", "precision": "bf16", "batch": 65536,
                  "samples_per_s": 2e6}]
        log = "test_x   3 passed   0 failed   0 skipped   1s  ok\ntests: 3 passed, 0 failed, 0 skipped\n"
        r, repo = self.visit(recs, peers, log)
        self.assertEqual(r.returncode, 0, r.stderr)
        measured = os.path.join(repo, "experiments", "measured")
        names = sorted(os.listdir(measured))
        self.assertEqual(names, ["archive", "h200x2_0123456_peers.jsonl", "h200x2_0123456_tests.txt",
                                 "h200x2_0123456_train.jsonl"])
        self.assertEqual(os.listdir(os.path.join(measured, "archive")), ["h200_fedcba9_train.jsonl"])
        with open(os.path.join(measured, "h200x2_0123456_peers.jsonl")) as f:
            for line in f:
                self.assertEqual(json.loads(line)["git"], REV)  # peers stamped with the visit's revision
        md = results_md(repo)
        self.assertIn("revision 0123456", md)
        self.assertIn("4M rows, uniform keys, as the peers draw them;", md)
        # 1 GPU, hashed keys: median of 10 M and 12 M = 11 M; against 4 M: 2.75x; against 2 M: 5.50x; 2 GPUs over 1:
        # 20/11; the direct index in a row of its own: 14 M, 3.50x
        self.assertIn("| dot (one key each) | hashed | 1 | 11.00 M |", md)
        self.assertIn("| dot (one key each) | direct | 1 | 14.00 M |", md)
        self.assertIn("**3.50x**", md)
        self.assertIn("**2.75x**", md)
        self.assertIn("**5.50x**", md)
        self.assertIn("1.82x", md)
        # dense: 3 x 2 x MACs x 65536 over 2 ms against 790 TFLOP/s
        macs = (13 * 512 + 512 * 256 + 256 * 128) + (479 * 1024 + 1024 * 1024 + 1024 * 512 + 512 * 256 + 256) + 27 * 27 * 128
        share = 6 * macs * 65536 / 1e12 / 2e-3 / 790 * 100
        self.assertIn(f"2.00 ({share:.0f}%)", md)
        self.assertIn("tests.log: tests: 3 passed, 0 failed, 0 skipped", md)

    def test_host_tier_rows(self):
        def coll(tag, ms):
            return {"program": "bench_collection", "bench": "collection", "tag": tag, "alpha": 1.1, "ms_step": ms,
                    "cache_gb": 0.5, "wrong": 0, "git": REV, "gpus": ["NVIDIA H200"], "rows": [4000000]}

        def fbgemm(cache_rows, ms):
            return {"peer": "fbgemm.tbe.collection", "alpha": 1.1, "cache_rows": cache_rows, "tables": "mlperf-v1",
                    "optimizer": "exact_rowwise_adagrad", "fresh_batches": 440, "step_ms": ms}

        recs = [coll("steady_hbm", 1.0), coll("steady_host", 1.6), coll("steady_host_lfu", 1.8),
                coll("steady_hbm_bf16", 0.9), coll("steady_host_bf16", 1.2)]
        r, repo = self.visit(recs, [fbgemm(0, 1.5), fbgemm(7890000, 3.2)])
        self.assertEqual(r.returncode, 0, r.stderr)
        md = results_md(repo)
        # LRU: 3.2 / 1.6 = 2.00x FBGEMM's cached step, 1.6 / 1.0 = 1.60x our HBM step; LFU: 3.2 / 1.8, 1.8 / 1.0;
        # bf16 rows: 1.5 / 0.9 and 3.2 / 1.2 against FBGEMM's fp32 rows, 1.2 / 0.9 against their own HBM step
        self.assertIn("| 1.600 | 3.200 | **2.00x** | 1.60x |", md)
        self.assertIn("| 1.800 | | **1.78x** (its LRU) | 1.80x |", md)
        self.assertIn("| the same, bf16 rows | power law 1.1 | HBM | 0.900 | 1.500 (fp32 rows) | **1.67x** |", md)
        self.assertIn("| 1.200 | 3.200 (fp32 rows) | **2.67x** | 1.33x (its HBM) |", md)

    def test_profiles_are_kept(self):
        extra = {"dcnv2_ncu.txt": "# ncu summary\n", "dot_trace.txt": "# trace rank 0: 0.000 dense: step\n",
                 "Bad Name_ncu.txt": "not kept: its name breaks the measured files' rule\n"}
        r, repo = self.visit([train("dot", 1, 10e6, 2.0)], [], extra=extra)
        self.assertEqual(r.returncode, 0, r.stderr)
        measured = os.path.join(repo, "experiments", "measured")
        with open(os.path.join(measured, "h200_0123456_dcnv2_ncu.txt")) as f:
            self.assertEqual(f.read(), "# ncu summary\n")
        self.assertTrue(os.path.exists(os.path.join(measured, "h200_0123456_dot_trace.txt")))
        self.assertFalse(any("Bad" in n for n in os.listdir(measured)))
        md = results_md(repo)
        self.assertIn("## Where the time goes", md)
        self.assertIn("`experiments/measured/h200_0123456_dcnv2_ncu.txt`, `experiments/measured/h200_0123456_dot_trace.txt`", md)

    def test_keys_of_older_records_are_named(self):
        rec = train("dot", 1, 10e6, 2.0)
        del rec["alpha"]  # a bench_train before --alpha drew the generator's power law 1.1
        r, repo = self.visit([rec], [])
        self.assertEqual(r.returncode, 0, r.stderr)
        md = results_md(repo)
        self.assertIn("sparta's keys by a power law (alpha 1.1", md)
        self.assertIn("not the same keys", md)

    def test_a_log_cut_short_is_summed(self):
        # no run_all summary (the call's limit came first): the suites' lines summed, the failed ones named
        log = ("test_a   3 passed   0 failed   1 skipped   1s  ok\n"
               "mpi_test_b (2 ranks)   4 passed   2 failed   0 skipped   2s  FAILED\n")
        r, repo = self.visit([train("dot", 1, 1e6, 1.0)], [], log)
        self.assertEqual(r.returncode, 0, r.stderr)
        md = results_md(repo)
        self.assertIn("tests.log: tests: 7 passed, 2 failed, 1 skipped in the 2 suites it reached before the call's "
                      "limit (failed: mpi_test_b)", md)

    def test_mixed_revisions_are_refused(self):
        r, repo = self.visit([train("dot", 1, 1e6, 1.0), train("dot", 1, 1e6, 1.0, rev="f" * 40)], [])
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertFalse(os.path.exists(os.path.join(repo, "experiments", "RESULTS.md")))

    def test_no_records_is_an_error(self):
        r, _ = self.visit([], [])
        self.assertEqual(r.returncode, 1)
        self.assertIn("no benchmark records", r.stderr)


if __name__ == "__main__":
    unittest.main()
