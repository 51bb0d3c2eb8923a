#!/usr/bin/env python3
"""Tests of experiments/ncu_summary.py on small ncu CSV reports written here: which step it sums, the units, the
sums by kernel and the errors. Expectations are worked out by hand in the comments. Run from the repository root
(test_experiments runs it)."""
import os
import subprocess
import sys
import tempfile
import unittest

SCRIPT = os.path.join(os.getcwd(), "experiments", "ncu_summary.py")
HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def kernel(i, name, ns, read, write, hit, read_unit="byte"):
    rows = []
    for metric, unit, value in (("gpu__time_duration.sum", "ns", ns), ("dram__bytes_read.sum", read_unit, read),
                                ("dram__bytes_write.sum", "byte", write), ("lts__t_sector_hit_rate.pct", "%", hit)):
        rows.append(f'"{i}","1","bench","h","{name}","1","7","(256, 1, 1)","(8, 1, 1)","0","9.0","m","{metric}",'
                    f'"{unit}","{value}"')
    return rows


def report(launches):
    lines = ["==PROF== Connected to process 1", "a line of the program's own", HEADER]
    for i, launch in enumerate(launches):
        lines += kernel(i, *launch)
    return "\n".join(lines) + "\n"


# Two steps, each starting with fill_kernel<long>: the first step's kernels are far larger, so a sum that takes
# them shows.
STEP = [("void sparta::fill_kernel<long>(long *, unsigned long, long)", "1,000", "0", "0", "0"),
        ("void sparta::update_kernel<4>(sparta::View)", "2,000,000", "6,000,000,000", "2,000,000,000", "40"),
        ("void sparta::update_kernel<4>(sparta::View)", "1,000,000", "1,000", "0", "10"),  # Mbyte below
        ("nvjet_gemm", "500,000", "1,000,000,000", "0", "80")]


class NcuSummary(unittest.TestCase):
    def run_on(self, text, *args):
        with tempfile.NamedTemporaryFile("w", suffix=".csv", delete=False) as f:
            f.write(text)
        self.addCleanup(os.unlink, f.name)
        return subprocess.run([sys.executable, SCRIPT, f.name, *args], capture_output=True, text=True)

    def test_last_step_summed_by_kernel(self):
        big = [(n, "9,000,000,000", r, w, h) for (n, _, r, w, h) in STEP]
        last = [STEP[0], STEP[1], STEP[2][:2] + ("1,000", "0", "10", "Mbyte"), STEP[3]]
        r = self.run_on(report(big + last), "--title", "t")
        self.assertEqual(r.returncode, 0, r.stderr)
        out = r.stdout.splitlines()
        self.assertIn("one step of the run: t", out[0])
        # update_kernel<4>: two launches, 2 + 1 ms, 6 GB + 1000 MB = 7 GB read, 2 GB written; hit rate weighted by
        # time (40 x 2 + 10 x 1) / 3 = 30; (7 + 2) / 3 = 3 TB/s. The list runs longest first; the 0.001 ms fill is
        # under --min-ms (0.01) and left out of the list only.
        self.assertEqual(out[2], "sparta::update_kernel<4> x2 | 3.000 | 7.00 | 2.00 | 30 | 3.00")
        self.assertEqual(out[3], "nvjet_gemm x1 | 0.500 | 1.00 | 0.00 | 80 | 2.00")
        self.assertFalse(any("fill_kernel" in line for line in out))
        # 3.501 ms, 8 GB read, 2 GB written, four launches
        self.assertEqual(out[-1], "# total 3.501 ms, 8.00 GB read, 2.00 GB written, 4 kernels (those under 0.01 ms "
                                  "left out of the list)")

    def test_nth_last_step(self):
        first = [(n, "9,000,000,000" if i == 1 else t, r, w, h) for i, (n, t, r, w, h) in enumerate(STEP)]
        r = self.run_on(report(first + STEP), "--nth-last", "2")
        self.assertEqual(r.returncode, 0, r.stderr)
        # the first step alone: update_kernel 9000 + 1 ms, not the second step's
        self.assertIn("sparta::update_kernel<4> x2 | 9001.000 |", r.stdout)
        self.assertIn("# total 9001.501 ms,", r.stdout)

    def test_errors(self):
        r = self.run_on(report(STEP[1:]))
        self.assertEqual(r.returncode, 1)
        self.assertIn("fewer than 1 kernel(s) match --step-start", r.stderr)
        r = self.run_on(report(STEP), "--nth-last", "2")
        self.assertEqual(r.returncode, 1)
        r = self.run_on("no report here\n")
        self.assertEqual(r.returncode, 1)
        self.assertIn("no kernel", r.stderr)
        bad = report(STEP).replace('"ns"', '"furlongs"')
        r = self.run_on(bad)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("furlongs", r.stderr)


if __name__ == "__main__":
    unittest.main()
