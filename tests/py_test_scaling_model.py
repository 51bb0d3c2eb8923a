#!/usr/bin/env python3
"""experiments/scaling_model.py: collective times, bytes per placement, the planner's choice and --check,
against values computed by hand here. Run by test_experiments (make test)."""
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "experiments"))
import scaling_model as sm  # noqa: E402

# 100 GB/s NVLink, 80 Gb/s IB (10 GB/s), no latency: times are bytes / bandwidth.
LINKS = {"nvlink_GBps": 100, "nvlink_latency_us": 0, "ib_Gbps_per_gpu": 80, "ib_efficiency": 1.0,
         "ib_latency_us": 0, "per_peer_us": 0}


def tiny_config():
    return {"model": {"name": "tiny", "cardinalities": [10, 20], "hotness": [1, 2], "max_rows": 0, "dim": 4,
                      "value_bytes": 4, "key_bytes": 8, "optimizer_state_per_value": 0, "load_factor": 0.5,
                      "dense_features": 3, "bottom_mlp": [4], "top_mlp": [2, 1], "batch_per_gpu": 3,
                      "key_alpha": 1.1},
            "rates": {"lookup_GBps": 1, "backward_GBps": 2, "dense_TFLOPs": 1, "step_overhead_us": 0},
            "links": dict(LINKS), "gpu_memory_GB": 80, "memory_fraction": 0.8, "hybrid_hot_rows": 5,
            "overlap_dense_allreduce": False, "sizes": {"nodes": [1, 2], "gpus_per_node": 4},
            "placements": list(sm.PLACEMENTS), "comm_modes": ["nccl", "hier"]}


class Links(unittest.TestCase):
    L = sm.link({"links": LINKS})

    def test_all_to_all(self):
        S = random.uniform(1e6, 1e9)
        # one node of 4: 3/4 of the buffer crosses NVLink
        self.assertAlmostEqual(sm.all_to_all_s(S, 1, 4, "nccl", self.L), S * 3 / 4 / 100e9)
        # two nodes of 4, flat: 3/8 over NVLink, 4/8 over IB, concurrently
        self.assertAlmostEqual(sm.all_to_all_s(S, 2, 4, "nccl", self.L), max(S * 3 / 8 / 100e9, S * 4 / 8 / 10e9))
        # hierarchical: 3/4 inside the node, then half across the two nodes
        self.assertAlmostEqual(sm.all_to_all_s(S, 2, 4, "hier", self.L), max(S * 3 / 4 / 100e9, S / 2 / 10e9))
        self.assertEqual(sm.all_to_all_s(S, 1, 1, "nccl", self.L), 0.0)

    def test_per_peer_overhead_favours_hier(self):
        L = dict(self.L, o=1e-6)
        S = 1024.0
        flat, hier = sm.all_to_all_s(S, 8, 8, "nccl", L), sm.all_to_all_s(S, 8, 8, "hier", L)
        self.assertAlmostEqual(flat - sm.all_to_all_s(S, 8, 8, "nccl", self.L), 63e-6)
        self.assertAlmostEqual(hier - sm.all_to_all_s(S, 8, 8, "hier", self.L), 14e-6)

    def test_all_reduce(self):
        S = random.uniform(1e6, 1e9)
        self.assertAlmostEqual(sm.all_reduce_s(S, 1, 4, "nccl", self.L), 2 * 3 / 4 * S / 100e9)
        self.assertAlmostEqual(sm.all_reduce_s(S, 2, 4, "nccl", self.L), 2 * 7 / 8 * S / 10e9)
        self.assertAlmostEqual(sm.all_reduce_s(S, 2, 4, "hier", self.L),
                               2 * S * 3 / 4 / 100e9 + 2 * 1 / 2 * S / 4 / 10e9)
        self.assertAlmostEqual(sm.reduce_scatter_s(S, 1, 4, "nccl", self.L), 3 / 4 * S / 100e9)

    def test_reductions_across_nodes_at_their_own_rate(self):
        S = random.uniform(1e6, 1e9)
        L = sm.link({"links": dict(LINKS, ib_reduce_Gbps=16)})  # 2 GB/s for reductions, the link's 10 GB/s else
        self.assertAlmostEqual(sm.all_reduce_s(S, 2, 4, "hier", L), 2 * S * 3 / 4 / 100e9 + 2 * 1 / 2 * S / 4 / 2e9)
        # MPI's reduce-scatter across nodes reduces the whole S / 4 at a root, as the all-reduce does (Open MPI's
        # libnbc), after NCCL's reduce-scatter in the node; a full-duplex link hides its smaller scatter
        self.assertAlmostEqual(sm.reduce_scatter_s(S, 2, 4, "hier", L), S * 3 / 4 / 100e9 + 2 * 1 / 2 * S / 4 / 2e9)
        # mode nccl: NCCL's ring reduce-scatter, half its all-reduce, which reduces on the GPUs at the link's rate
        self.assertAlmostEqual(sm.reduce_scatter_s(S, 2, 4, "nccl", L), 7 / 8 * S / 10e9)
        # of that, the root's reduction in host memory (not link time): the same bytes at 2 GB/s less at 10 GB/s
        self.assertAlmostEqual(sm.host_reduction_s("reducescatter", S, 2, 4, "hier", L), S / 4 / 2e9 - S / 4 / 10e9)
        self.assertAlmostEqual(sm.host_reduction_s("allreduce", S, 2, 4, "hier", L), S / 4 / 2e9 - S / 4 / 10e9)
        for kind, mode, N in (("allreduce", "nccl", 2), ("allreduce", "hier", 1), ("allgather", "hier", 2)):
            self.assertEqual(sm.host_reduction_s(kind, S, N, 4, mode, L), 0.0, (kind, mode, N))
        # an all-gather reduces nothing: the link's rate
        self.assertAlmostEqual(sm.all_gather_s(S, 2, 4, "hier", L), sm.all_reduce_s(S, 2, 4, "hier", self.L) / 2)
        # one node: NVLink alone, whatever the rate across nodes
        self.assertAlmostEqual(sm.all_reduce_s(S, 1, 4, "hier", L), sm.all_reduce_s(S, 1, 4, "hier", self.L))

    def test_reduction_rate_follows_the_calibrated_sizes(self):
        # 4 GB/s at 1 MB, 1 GB/s at 16 MB: interpolated in log size (4 MB: half way), flat beyond the ends
        L = sm.link({"links": dict(LINKS, ib_reduce_curve=[[16 << 20, 1.0], [1 << 20, 4.0]])})
        self.assertAlmostEqual(sm.reduce_rate(L, 4 << 20), 2.5e9)
        self.assertAlmostEqual(sm.reduce_rate(L, 1 << 20), 4e9)
        self.assertAlmostEqual(sm.reduce_rate(L, 1 << 10), 4e9)
        self.assertAlmostEqual(sm.reduce_rate(L, 1 << 30), 1e9)
        # one rank per node: MPI's all-reduce alone, at the rate of its size
        for S, rate in ((1 << 10, 4e9), (4 << 20, 2.5e9), (1 << 30, 1e9)):
            self.assertAlmostEqual(sm.all_reduce_s(S, 2, 1, "hier", L), S / rate)
        self.assertEqual(sm.reduce_rate(self.L, 1 << 20), 10e9)  # no curve: the link's rate

    def test_half_duplex_links(self):
        S = random.uniform(1e6, 1e9)
        # half duplex (a rank's sends and receives share the link between nodes): a balanced all-to-all as on a
        # full-duplex link, and MPI's reduce-scatter saves what its scatter does not send: S / N of the root's
        # bytes at 20 GB/s
        H = sm.link({"links": dict(LINKS, inter_duplex="half")})
        self.assertAlmostEqual(sm.all_to_all_s(S, 2, 1, "hier", H), S / 2 / 10e9)
        R = sm.link({"links": dict(LINKS, inter_duplex="half", ib_reduce_Gbps=16)})
        self.assertAlmostEqual(sm.reduce_scatter_s(S, 2, 1, "hier", R), S / 2e9 - S / 2 / 20e9)


class Placements(unittest.TestCase):
    def test_bytes_per_placement(self):
        cfg = tiny_config()
        b = 3  # per rank: nnz = 3 * (1 + 2) = 9 keys, bags = 3 * 2 = 6

        def distinct(rows, draws, alpha=1.1):  # expected distinct keys, P(rank r) ~ r^-alpha, summed exactly
            w = [r ** -alpha for r in range(1, rows + 1)]
            return sum(1 - (1 - x / sum(w)) ** draws for x in w)

        # dispatch: a rank's distinct keys (3 and 6 lookups into 10 and 20 rows) out, a vector each back, a
        # gradient sum each out
        u = distinct(10, 3) + distinct(20, 6)
        colls, work = sm.collectives(cfg, "dispatch", b, 1, 4)
        self.assertEqual([c for c, _ in colls], ["alltoall"] * 3)
        for (_, got), want in zip(colls, (u * 8, u * 16, u * 16)):
            self.assertAlmostEqual(got, want, places=6)
        self.assertLess(u, 9)
        self.assertEqual(work, (9, 6))
        # localized: one group of every owner: all-to-alls of a rank's share scaled by the busiest owner's skew (two
        # tables of 12 x 2 and 12 x 3 lookups and bags on 4 ranks: the busiest owner 36 of 60, 2.4 x an even share)
        colls, _ = sm.collectives(cfg, "localized", b, 1, 4)
        self.assertEqual([c for c, _ in colls], ["alltoall"] * 3)
        for (_, got), want in zip(colls, (2.4 * (72 + 48), 2.4 * 96, 2.4 * 96)):
            self.assertAlmostEqual(got, want)
        colls, work = sm.collectives(cfg, "distributed", b, 1, 4)  # global batch 12: 36 keys, 24 bags
        self.assertEqual(colls, [("alltoall", 72), ("alltoall", 72), ("reducescatter", 384), ("allgather", 384)])
        self.assertEqual(work, (9, 24))
        # replicated: 4 ranks x their distinct keys, then their sums (16 bytes each), all-gathered; one rank: none
        colls, _ = sm.collectives(cfg, "replicated", b, 1, 4)
        self.assertEqual([c for c, _ in colls], ["allgather", "allgather"])
        self.assertAlmostEqual(colls[0][1], 4 * u * 8)
        self.assertAlmostEqual(colls[1][1], 4 * u * 16)
        self.assertEqual(sm.collectives(cfg, "replicated", b, 1, 1)[0], [])

    def test_localized_assignment(self):
        self.assertEqual(sm.localized_assignment([5, 3, 2, 2], 2), [7, 5])

    def test_hot_fraction(self):
        self.assertEqual(sm.hot_fraction(1000, 1000, 1.1), 1.0)
        self.assertAlmostEqual(sm.hot_fraction(1000, 100, 0.0), 0.1)

    def test_step_parts_add_up(self):
        cfg = tiny_config()
        p = sm.predict(cfg, "dispatch", "nccl", 1, 4, 3)
        L = sm.link(cfg)
        u = sum(min(r, sm.expected_distinct(r, 3 * h, 1.1)) for r, h in ((10, 1), (20, 2)))  # distinct keys
        comm = sm.all_to_all_s(u * 8, 1, 4, "nccl", L) + 2 * sm.all_to_all_s(u * 16, 1, 4, "nccl", L)
        fwd = (9 * 16 + 6 * 16) / 1e9
        bwd = (2 * 9 * 16 + 6 * 16) / 2e9
        flops, params = sm.dense_flops_per_sample(cfg["model"])
        # bottom 3->4 (16 params), top (3 vectors: 3 pairs + 4) = 7 -> 2 -> 1 (16 + 3)
        self.assertEqual(params, 16 + 16 + 3)
        self.assertEqual(flops, 3 * (2 * 35 + 2 * 3 * 4))
        dense = 3 * flops / 1e12 + sm.all_reduce_s(params * 4, 1, 4, "nccl", L)
        self.assertAlmostEqual(p["ms_step"], 1e3 * (fwd + bwd + comm + dense))
        self.assertAlmostEqual(p["ms_comm"], 1e3 * comm)

    def test_choice_skips_what_does_not_fit(self):
        cfg = tiny_config()
        cfg["model"]["cardinalities"] = [10 ** 9, 20]
        cfg["gpu_memory_GB"] = 20  # 1e9 rows x 16 B / 0.5 = 32 GB: only spread placements fit on 4+ GPUs
        preds = [sm.predict(cfg, pl, "nccl", 2, 4, 3) for pl in sm.PLACEMENTS]
        fits = {p["placement"]: p["fits"] for p in preds}
        self.assertEqual(fits["replicated"], False)
        self.assertEqual(fits["localized"], False)
        self.assertEqual(fits["dispatch"], True)
        self.assertIn(sm.choose(preds)["placement"], {"dispatch", "distributed", "hybrid"})


class Cli(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sparta_py_test_model_")
        self.cfg = os.path.join(self.dir, "cfg.json")
        with open(self.cfg, "w") as f:
            json.dump(tiny_config(), f)

    def run_model(self, *args):
        return subprocess.run([sys.executable, os.path.join(ROOT, "experiments", "scaling_model.py"), "--config",
                               self.cfg, *args], capture_output=True, text=True, timeout=120)

    def test_sizes_outputs_and_plot(self):
        out, png = os.path.join(self.dir, "p.jsonl"), os.path.join(self.dir, "p.png")
        r = self.run_model("--out", out, "--plot", png)
        self.assertEqual(r.returncode, 0, r.stderr)
        with open(out) as f:
            rows = [json.loads(l) for l in f]
        self.assertEqual(len(rows), 2 * 5 * 2)  # nodes x placements x modes
        for n in (1, 2):
            mine = [x for x in rows if x["nodes"] == n]
            chosen = [x for x in mine if x["chosen"]]
            self.assertEqual(len(chosen), 1)
            self.assertEqual(chosen[0]["ms_step"], min(x["ms_step"] for x in mine if x["fits"]))
        self.assertGreater(os.path.getsize(png), 1000)
        self.assertIn("choice", r.stdout)

    def test_check_reports_error_per_point(self):
        S = 4e8
        meas_us = random.uniform(1000, 9000)
        want_us = S * 3 / 4 / 100e9 * 1e6  # one node of 4 ranks
        recs = os.path.join(self.dir, "m.jsonl")
        with open(recs, "w") as f:
            f.write(json.dumps({"bench": "bench_alltoall", "op": "alltoall", "mode": "nccl", "ranks": 4, "nodes": 1,
                                "bytes_per_rank": S, "time_us": meas_us}) + "\n")
            f.write(json.dumps({"bench": "something_else"}) + "\n")
        r = self.run_model("--check", recs)
        self.assertEqual(r.returncode, 0, r.stderr)
        err = (want_us - meas_us) / meas_us * 100
        self.assertIn(f"{err:.1f}%", r.stdout)
        self.assertIn("check: 1 point(s)", r.stdout)

    def test_calibrate_from_bench_records(self):
        recs = os.path.join(self.dir, "c.jsonl")
        with open(recs, "w") as f:
            for gbps in (100.0, 300.0, 200.0):
                f.write(json.dumps({"bench": "embedding", "mode": "eval", "batch": 64, "GBps": gbps}) + "\n")
            f.write(json.dumps({"bench": "embedding", "mode": "eval", "batch": 32, "GBps": 5.0}) + "\n")
        cfg, notes = sm.calibrate(tiny_config(), sm.read_jsonl([recs]))
        self.assertEqual(cfg["rates"]["lookup_GBps"], 200.0)  # median at the largest batch
        self.assertEqual(cfg["rates"]["backward_GBps"], 2)  # no step record: unchanged
        self.assertEqual(len(notes), 1)

    def test_calibrate_links_between_nodes(self):
        recs = os.path.join(self.dir, "n.jsonl")
        with open(recs, "w") as f:
            for op, size, busbw, t in (("alltoall", 1 << 20, 2.0, 40.0), ("alltoall", 8 << 20, 5.0, 900.0),
                                       ("alltoall", 64 << 20, 4.0, 8000.0), ("alltoall", 256 << 20, 6.0, 9e4),
                                       ("allreduce", 8 << 20, 2.5, 3e3), ("allreduce", 256 << 20, 1.2, 2e5)):
                f.write(json.dumps({"bench": "bench_alltoall", "op": op, "mode": "hier", "nodes": 2, "ranks": 2,
                                    "bytes_per_rank": size, "busbw_GBps": busbw, "time_us": t}) + "\n")
            # one node: not the link between nodes
            f.write(json.dumps({"bench": "bench_alltoall", "op": "alltoall", "mode": "hier", "nodes": 1, "ranks": 2,
                                "bytes_per_rank": 8 << 20, "busbw_GBps": 300.0, "time_us": 10.0}) + "\n")
        cfg, notes = sm.calibrate(tiny_config(), sm.read_jsonl([recs]))
        self.assertAlmostEqual(cfg["links"]["ib_Gbps_per_gpu"], 5.0 * 8)  # median from 4 MB: 5, 4, 6
        self.assertEqual(cfg["links"]["ib_efficiency"], 1.0)
        self.assertEqual(cfg["links"]["ib_latency_us"], 40.0)
        self.assertAlmostEqual(cfg["links"]["ib_reduce_Gbps"], 1.2 * 8)  # the largest all-reduce
        self.assertEqual(len(notes), 2)
        # records without hosts or ranks per node: a full-duplex link, no reduction curve
        self.assertEqual(cfg["links"]["inter_duplex"], "full")
        self.assertNotIn("ib_reduce_curve", cfg["links"])

    def test_calibrate_emulated_nodes(self):
        # 2 nodes of one rank on one host: half duplex, and the all-reduce's rate at each size net of the latency
        recs = os.path.join(self.dir, "e.jsonl")
        rows = [("alltoall", 64 << 10, 1.0, 30.0), ("alltoall", 16 << 20, 4.0, 2000.0),
                ("allreduce", 1 << 20, 2.0, 530.0), ("allreduce", 64 << 20, 1.0, 70030.0)]
        with open(recs, "w") as f:
            for op, size, busbw, t in rows:
                f.write(json.dumps({"bench": "bench_alltoall", "op": op, "mode": "hier", "nodes": 2, "ranks": 2,
                                    "ranks_per_node": 1, "hosts": ["h"], "bytes_per_rank": size, "busbw_GBps": busbw,
                                    "time_us": t}) + "\n")
        cfg, notes = sm.calibrate(tiny_config(), sm.read_jsonl([recs]))
        self.assertEqual(cfg["links"]["inter_duplex"], "half")
        curve = cfg["links"]["ib_reduce_curve"]
        self.assertEqual([s for s, _ in curve], [1 << 20, 64 << 20])
        self.assertAlmostEqual(curve[0][1], (1 << 20) / 500e-6 / 1e9)  # 530 us less the 30 us latency
        self.assertAlmostEqual(curve[1][1], (64 << 20) / 70000e-6 / 1e9)
        # the model gives each all-reduce record its time back
        for desc, meas, pred, unit in sm.check(cfg, sm.read_jsonl([recs])):
            if desc.startswith("allreduce"):
                self.assertAlmostEqual(pred, meas, delta=1e-6 * meas, msg=desc)
        # ranks of two hosts: a real link, full duplex
        with open(recs, "w") as f:
            f.write(json.dumps({"bench": "bench_alltoall", "op": "alltoall", "mode": "hier", "nodes": 2, "ranks": 2,
                                "hosts": ["a", "b"], "bytes_per_rank": 16 << 20, "busbw_GBps": 4.0,
                                "time_us": 2000.0}) + "\n")
        self.assertEqual(sm.calibrate(tiny_config(), sm.read_jsonl([recs]))[0]["links"]["inter_duplex"], "full")


class FitAndCheck(unittest.TestCase):
    """--fit recovers the embedding rates planted in bench_collection-shaped records (the planner-structured terms:
    links' time, local bytes, collectives, groups), the train embedding scale and the dense time per (model,
    precision) from bench_train-shaped ones; --check predicts them back, and --loo predicts each from the others."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="sparta_py_test_fit_")
        self.cfg = tiny_config()
        self.rates = {"comm_scale": random.uniform(0.5, 3), "hbm_GBps": random.uniform(0.5, 5),
                      "collective_us": random.uniform(10, 900), "group_us": random.uniform(50, 500),
                      "round_trip_us": sm.HOST_ROUND_TRIP_US, "new_row_ns": random.uniform(1, 20)}
        self.train_scale = random.uniform(0.4, 0.9)
        self.per_sample = {"dot/fp32": random.uniform(1e-4, 1e-3), "dot/bf16": random.uniform(1e-5, 1e-4),
                           "dcnv2/bf16": random.uniform(1e-4, 1e-3)}
        self.rows = []
        for placement in ("dispatch", "localized", "replicated"):
            for b, ranks in ((100, 2), (400, 2), (200, 1)):
                r = {"bench": "collection", "placement": placement, "rows": [10, 20], "hotness": [1, 2],
                     "dims": [4, 4], "dim": 4, "alpha": 0, "batch": b, "global_batch": ranks * b, "ranks": ranks,
                     "nodes": 1, "ranks_per_node": ranks, "comm_mode": "nccl", "optimizer": "sgd", "git": "abc",
                     "backend": "cpu", "prefill": 1,
                     "new_rows_per_step": [0, 4e4, 9e4][len(self.rows) % 3] * random.uniform(0.5, 1.5)}
                c, pl, N, G, bb, _ = sm.record_shape(self.cfg, dict(r, ms_step=1))
                r["ms_step"] = sm.embedding_ms(sm.embedding_terms(c, pl, "nccl", N, G, bb), self.rates)
                self.rows.append(r)
        # train records: the embedding phase at train_scale x the collection's model (adagrad), dense per model
        for model, prec, b in (("dot", "fp32", 300), ("dot", "bf16", 300), ("dcnv2", "bf16", 300), ("dot", "fp32", 600)):
            t = {"bench": "train", "placement": "replicated", "model": model, "precision": prec, "preset": "small",
                 "rows": [10, 20], "mean_hotness": [1, 2], "key_alpha": [1.1, 1.1], "embedding_dim": 4,
                 "model_shape": f"{model}, bottom MLP 3-4, 2 x 4 embeddings, top MLP 7-2-1, f32", "batch_per_rank": b,
                 "global_batch": b, "ranks": 1, "nodes": 1, "ranks_per_node": 1, "comm_mode": "hier",
                 "ms_data": 0.1 * b / 300, "ms_comm": 0.0}
            c, pl, N, G, bb, _ = sm.record_shape(self.cfg, dict(t, ms_step=1))
            self.assertEqual(c["model"]["optimizer_state_per_value"], 1)  # adagrad
            t["ms_embedding"] = self.train_scale * sm.embedding_ms(sm.embedding_terms(c, pl, "hier", N, G, bb),
                                                                   self.rates)
            t["ms_dense"] = self.per_sample[f"{model}/{prec}"] * b
            t["ms_step"] = t["ms_embedding"] + t["ms_dense"] + t["ms_data"]
            self.rows.append(t)
        self.path = os.path.join(self.dir, "m.jsonl")
        with open(self.path, "w") as f:
            for r in self.rows:
                f.write(json.dumps(r) + "\n")
        with open(os.path.join(self.dir, "cfg.json"), "w") as f:
            json.dump(self.cfg, f)

    def test_one_rank_terms(self):
        # one rank: nothing moves; replicated and localized look up in place (one pooled lookup, one update of
        # the bags' keys), dispatch keeps its routing passes and copies its buffers
        c = sm.record_shape(self.cfg, dict(self.rows[2], ms_step=1))[0]
        rep = sm.embedding_terms(c, "replicated", "nccl", 1, 1, 200)
        loc = sm.embedding_terms(c, "localized", "nccl", 1, 1, 200)
        self.assertEqual(rep, loc)
        self.assertEqual((rep["comm"], rep["collectives"], rep["groups"]), (0.0, 0, 1))
        v, k = 16, 16  # 4 floats; a key pass

        def by_hand(q):  # q: a lookup's probe per key (hash slots: the key pass and a 128-byte bucket)
            want = 0
            for R, h in ((10, 1), (20, 2)):
                K, P = 200 * h, 200
                U = R * (1 - (1 - 1 / R) ** K)
                want += (q * K + K * v + P * v) + (4 * k * K + K * v + U * 2 * v)
            return want
        self.assertAlmostEqual(rep["local_GB"] * 1e9, by_hand(k + 128), places=3)
        d = sm.record_shape(self.cfg, dict(self.rows[2], ms_step=1, index="direct"))[0]
        self.assertAlmostEqual(sm.embedding_terms(d, "replicated", "nccl", 1, 1, 200)["local_GB"] * 1e9, by_hand(k),
                               places=3)
        self.assertGreater(sm.embedding_terms(c, "dispatch", "nccl", 1, 1, 200)["local_GB"], rep["local_GB"])
        # two ranks: one group, localized too (every owner's tables)
        two = sm.embedding_terms(c, "localized", "nccl", 1, 2, 200)
        self.assertEqual((two["groups"], two["collectives"]), (1, 5))
        self.assertEqual(sm.embedding_terms(c, "dispatch", "nccl", 1, 2, 200)["groups"], 1)

    def test_round_trips(self):
        # what each placement runs per group (src/placement_*.cpp): count downloads (host round trips), on one rank
        # too
        c = sm.record_shape(self.cfg, dict(self.rows[2], ms_step=1))[0]
        b = 200
        for pl, one, two in (("dispatch", 2, 2), ("localized", 0, 1), ("distributed", 1, 1), ("replicated", 0, 1),
                             ("hybrid", 5, 5)):
            t1 = sm.embedding_terms(c, pl, "nccl", 1, 1, b)
            t2 = sm.embedding_terms(c, pl, "nccl", 1, 2, b)
            self.assertEqual(t1["round_trips"], one, pl)
            self.assertEqual(t2["round_trips"], two * t2["groups"], pl)

    def test_new_rows(self):
        # a record's new rows per step (all ranks) per rank; records from before the prefill (no such field) with
        # hashed tables filled during their steps: the new keys of the median timed step, computed here for
        # uniform keys, every copy inserting them under replicated; none with a direct index or the prefill
        r = dict(self.rows[0], ms_step=1)  # dispatch, 2 ranks, batch 100
        self.assertEqual(sm.record_shape(self.cfg, r)[0]["model"]["new_rows_per_rank"], r["new_rows_per_step"] / 2)
        old = {k: v for k, v in r.items() if k not in ("prefill", "new_rows_per_step")}
        old.update(warmup=2, iters=5)
        s = 2 + (5 - 1) / 2
        want = sum(R * ((1 - 1 / R) ** (s * 200 * h) - (1 - 1 / R) ** ((s + 1) * 200 * h))
                   for R, h in ((10, 1), (20, 2)))
        for pl, copies in (("dispatch", 1), ("replicated", 2)):
            got = sm.record_shape(self.cfg, dict(old, placement=pl))[0]["model"]["new_rows_per_rank"]
            self.assertAlmostEqual(got, want * copies / 2, places=9)
        big = dict(old, rows=[10 ** 6], hotness=[1])  # far from full: nearly every key of a step is new
        self.assertAlmostEqual(sm.record_shape(self.cfg, big)[0]["model"]["new_rows_per_rank"], 100, delta=0.1)
        self.assertEqual(sm.record_shape(self.cfg, dict(big, index="direct"))[0]["model"]["new_rows_per_rank"], 0)
        self.assertEqual(sm.record_shape(self.cfg, dict(big, prefill=1))[0]["model"]["new_rows_per_rank"], 0)
        # each new row adds new_row_ns
        c = sm.record_shape(self.cfg, big)[0]
        t = sm.embedding_terms(c, "dispatch", "nccl", 1, 2, 100)
        t0 = dict(t, new_rows=0)
        self.assertAlmostEqual(sm.embedding_ms(t, self.rates) - sm.embedding_ms(t0, self.rates),
                               1e-6 * t["new_rows"] * self.rates["new_row_ns"], places=12)

    def test_expected_distinct(self):
        self.assertAlmostEqual(sm.expected_distinct(10, 1e6, 0), 10)
        self.assertAlmostEqual(sm.expected_distinct(1000, 1, 0), 1, places=6)
        # skewed keys: fewer distinct than uniform, at least one
        self.assertLess(sm.expected_distinct(10 ** 6, 10 ** 5, 1.1), sm.expected_distinct(10 ** 6, 10 ** 5, 0))

    def test_fit_recovers_the_planted_rates(self):
        f = sm.fit(self.cfg, self.rows)["fit"]
        e = f["embedding_rates"]
        for k, want in self.rates.items():
            self.assertAlmostEqual(e[k] / want, 1.0, places=5, msg=k)
        self.assertEqual(e["points"], 9)
        self.assertAlmostEqual(f["train_embedding_scale"], self.train_scale, places=6)
        for k, want in self.per_sample.items():
            self.assertAlmostEqual(f["dense_ms_per_sample"][k], want, places=12)
        self.assertEqual(f["source"]["revisions"], ["abc"])

    def test_train_factor_leaves_the_links_alone(self):
        # the train embedding factor scales the local work, not the links' time nor MPI's host reductions: a
        # 2-rank train record across 2 emulated nodes, its parts computed here
        cfg = sm.fit(self.cfg, self.rows)
        cfg["links"] = dict(LINKS, inter_duplex="half", ib_reduce_Gbps=8)  # reductions at 1 GB/s
        t = dict(self.rows[-1], ranks=2, nodes=2, ranks_per_node=1, global_batch=1200, batch_per_rank=600,
                 ms_comm=0.0)
        e, f = cfg["fit"]["embedding_rates"], cfg["fit"]["train_embedding_scale"]
        c, pl, N, G, b, _ = sm.record_shape(cfg, dict(t, ms_step=1))
        terms = sm.embedding_terms(c, pl, "hier", N, G, b)
        self.assertGreater(terms["comm"], 0)
        rest = (terms["local_GB"] / e["hbm_GBps"] + 1e-6 * (
            terms["collectives"] * e["collective_us"] + terms["groups"] * e["group_us"]
            + terms["round_trips"] * e["round_trip_us"]))
        got = sm.predict_record(cfg, t)[3]["ms_embedding"]
        self.assertAlmostEqual(got, 1e3 * (terms["comm"] * e["comm_scale"] + terms["reduce"] + f * rest), places=9)
        # distributed reduce-scatters: the root's reduction (1 GB/s less 10 GB/s on its B T d e bytes) is unscaled
        d = sm.embedding_terms(c, "distributed", "hier", N, G, b)
        B, T, v = 1200, 2, 16
        self.assertAlmostEqual(d["reduce"], B * T * v / 1e9 - B * T * v / 10e9)
        colls = sm.collectives(c, "distributed", b, N, G)[0]
        link = sm.link(c)
        self.assertAlmostEqual(d["comm"] + d["reduce"],
                               sum(sm.COLLECTIVES[k](S, N, G, "hier", link) for k, S in colls))

    def test_route_ahead_takes_the_route_off_the_step(self):
        # a train record with route_ahead: dispatch on 2 ranks loses its route's terms (the keys' sort, distinct
        # set, buckets and arrival places per table, computed here; 2 round trips, 2 collectives, the keys'
        # all-to-all) at the fitted rates and the train factor; nothing on one rank or under replicated
        cfg = sm.fit(self.cfg, self.rows)
        e, f = cfg["fit"]["embedding_rates"], cfg["fit"]["train_embedding_scale"]
        t = dict(self.rows[-1], placement="dispatch", ranks=2, ranks_per_node=2, global_batch=1200,
                 batch_per_rank=600)
        on, off = sm.predict_record(cfg, dict(t, route_ahead=True)), sm.predict_record(cfg, t)
        c, pl, N, G, b, _ = sm.record_shape(cfg, dict(t, ms_step=1))
        local, keys = 0.0, 0.0
        for R, h in ((10, 1), (20, 2)):
            K = b * h
            U = min(R, sm.expected_distinct(R, K, 1.1))
            local += (sm.KEY_SORT + 5 * sm.KEY_PASS) * K + (36 + 2 * sm.KEY_PASS) * U + sm.bucket_bytes(U, 2)
            keys += U
        link = 1e3 * e["comm_scale"] * sm.all_to_all_s(keys * 8, N, G, "hier", sm.link(c))
        rest = local / 1e9 / e["hbm_GBps"] + 1e-6 * (2 * e["collective_us"] + 2 * e["round_trip_us"])
        self.assertAlmostEqual(on[3]["ms_route_ahead"], -(link + 1e3 * f * rest), places=9)
        self.assertAlmostEqual(on[2], off[2] + on[3]["ms_route_ahead"], places=9)
        self.assertNotIn("ms_route_ahead", off[3])
        for other in (dict(t, ranks=1, ranks_per_node=1, global_batch=600), dict(t, placement="replicated")):
            self.assertNotIn("ms_route_ahead", sm.predict_record(cfg, dict(other, route_ahead=True))[3])

    def test_dense_of_an_unmeasured_pair(self):
        # dcnv2 fp32 was not measured: dcnv2 bf16 times dot's fp32 / bf16 ratio
        cfg = sm.fit(self.cfg, self.rows)
        m = {"dense_model": "dcnv2"}
        want = self.per_sample["dcnv2/bf16"] * self.per_sample["dot/fp32"] / self.per_sample["dot/bf16"] * 50
        self.assertAlmostEqual(sm.dense_ms(cfg, m, 50, "fp32"), want, places=9)

    def test_check_and_leave_one_out(self):
        cfg = sm.fit(self.cfg, self.rows)
        for desc, meas, pred, unit in sm.check(cfg, self.rows):
            self.assertAlmostEqual(pred, meas, delta=1e-6 * meas, msg=desc)
        # leave one out: each collection point from the eight others, each train point from the rest
        loo = sm.check(self.cfg, self.rows, loo=True)
        self.assertEqual(len(loo), 13)
        for desc, meas, pred, unit in loo[:10] + loo[12:]:  # bf16 dot and dcnv2 are each the only one of its pair
            self.assertAlmostEqual(pred, meas, delta=1e-5 * meas, msg=desc)

    def test_cli_fit_writes_config_and_check_prints_errors(self):
        cfg_path, out = os.path.join(self.dir, "cfg.json"), os.path.join(self.dir, "fitted.json")
        script = os.path.join(ROOT, "experiments", "scaling_model.py")
        r = subprocess.run([sys.executable, script, "--config", cfg_path, "--fit", self.path, "--write-config", out,
                            "--check", self.path], capture_output=True, text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("check: 13 point(s), mean |error| 0.0%", r.stdout)
        with open(out) as f:
            written = json.load(f)
        self.assertAlmostEqual(written["fit"]["embedding_rates"]["hbm_GBps"], self.rates["hbm_GBps"], places=5)
        # the written config predicts the same without refitting
        r = subprocess.run([sys.executable, script, "--config", out, "--check", self.path], capture_output=True,
                           text=True, timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("max 0.0%", r.stdout)
        r = subprocess.run([sys.executable, script, "--config", cfg_path, "--check", self.path, "--loo"],
                           capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--loo", r.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)
