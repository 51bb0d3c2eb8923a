#!/usr/bin/env python3
"""Run a sweep: one launch of an experiment binary per point of a grid of axes, into a results folder.

    experiments/sweeps/sweep.py experiments/sweeps/alltoall.json --results results/alltoall
    experiments/sweeps/sweep.py CONFIG --dry-run                       # print the commands only
    experiments/sweeps/sweep.py CONFIG --set ranks=1,2 --set bytes=4K  # override axes
    experiments/sweeps/sweep.py CONFIG --launcher srun --gpus-per-node 8
    experiments/sweeps/sweep.py CONFIG --launcher sbatch --time 00:20:00 [--submit]

The config (JSON) names the axes and the command template:

    {
      "name": "alltoall",
      "command": ["{bin}/bench_alltoall", "--modes", "{mode}", "--min-bytes", "{bytes}", "--max-bytes", "{bytes}",
                  "--out", "{out}", "--tag", "{tag}"],
      "axes": {"ranks": [2, 4, 8], "mode": ["nccl", "hier"], "bytes": ["1M", "64M"]},
      "exclude": [{"mode": "nccl", "ranks": 1}],      optional: points matching every key of one entry are left out
      "gpus_per_node": 8, "time": "00:10:00",          optional defaults of --gpus-per-node and --time
      "env": {"NCCL_NVLS_ENABLE": "0"}                 optional environment of every launch
    }

Every point is the cartesian product of the axes (in the order written). Each command token is formatted
with the point's axis values and: {bin} (BUILD/bin), {build}, {out} (the point's JSON-lines file), {tag} (the
point's name), {point_dir}, {ranks}, {nodes}, {gpus_per_node}, {ranks_per_node}, and for every integer axis
value {AXIS_per_rank} = value // ranks (strong scaling: an axis global_batch, the command's --batch
{global_batch_per_rank}). The axis `ranks` is the
number of MPI ranks (default 1); an axis `nodes` without `ranks` means nodes x gpus_per_node ranks.

Results folder:
    sweep.json                the config as run, the command line and the time
    points/<name>/command.txt the launch command
    points/<name>/log.txt     its stdout and stderr
    points/<name>/status.json {"status": "ok" | "failed" | "written" | "submitted", "exit_status": n, ...}
    points/<name>/results.jsonl   the JSON lines the binary wrote (--out {out})
    results.jsonl             every finished point's lines (of the grid this run covers), rebuilt at its end

A point whose status is "ok" is finished and not run again (--force reruns it); a failed point is recorded
with its exit status and log, the sweep goes on, and the next run retries it. Exit status: 0 when every
point is finished (or, with sbatch, written or submitted), 1 when a point failed, 2 on a bad config or option.
"""
import argparse
import itertools
import json
import os
import re
import shlex
import shutil
import socket
import subprocess
import sys
import time

CONFIG_KEYS = {"name", "description", "command", "axes", "exclude", "gpus_per_node", "time", "env"}
FINISHED = "ok"


class ConfigError(Exception):
    pass


def load_config(path):
    try:
        with open(path) as f:
            cfg = json.load(f)
    except OSError as e:
        raise ConfigError(f"{path}: cannot read ({e.strerror})")
    except json.JSONDecodeError as e:
        raise ConfigError(f"{path}: not JSON ({e})")
    if not isinstance(cfg, dict):
        raise ConfigError(f"{path}: expected a JSON object, found {type(cfg).__name__}")
    unknown = sorted(set(cfg) - CONFIG_KEYS)
    if unknown:
        raise ConfigError(f"{path}: unknown field(s) {', '.join(unknown)} (expected {', '.join(sorted(CONFIG_KEYS))})")
    for key in ("name", "command", "axes"):
        if key not in cfg:
            raise ConfigError(f"{path}: field '{key}' is missing")
    if not isinstance(cfg["name"], str) or not re.fullmatch(r"[A-Za-z0-9_.-]+", cfg["name"]):
        raise ConfigError(f"{path}: field 'name': expected letters, digits, '_', '.' or '-', found {cfg['name']!r}")
    cmd = cfg["command"]
    if not isinstance(cmd, list) or not cmd or not all(isinstance(t, str) for t in cmd):
        raise ConfigError(f"{path}: field 'command': expected a non-empty list of strings, found {cmd!r}")
    axes = cfg["axes"]
    if not isinstance(axes, dict):
        raise ConfigError(f"{path}: field 'axes': expected an object of lists, found {axes!r}")
    for name, values in axes.items():
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
            raise ConfigError(f"{path}: axes: '{name}' is not a valid axis name (letters, digits, '_')")
        if not isinstance(values, list) or not values:
            raise ConfigError(f"{path}: axes.{name}: expected a non-empty list, found {values!r}")
    for name in ("ranks", "nodes"):
        for v in axes.get(name, []):
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"{path}: axes.{name}: expected positive integers, found {v!r}")
    excl = cfg.get("exclude", [])
    if not isinstance(excl, list) or not all(isinstance(e, dict) for e in excl):
        raise ConfigError(f"{path}: field 'exclude': expected a list of objects, found {excl!r}")
    env = cfg.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str) for v in env.values()):
        raise ConfigError(f"{path}: field 'env': expected an object of strings, found {env!r}")
    gpn = cfg.get("gpus_per_node", 8)
    if not isinstance(gpn, int) or gpn < 1:
        raise ConfigError(f"{path}: field 'gpus_per_node': expected a positive integer, found {gpn!r}")
    return cfg


def parse_value(text):
    """An axis value given on the command line: an int or float when it reads as one, else the text."""
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def apply_overrides(axes, sets):
    axes = dict(axes)
    for s in sets:
        if "=" not in s:
            raise ConfigError(f"--set: expected AXIS=V1,V2,..., found '{s}'")
        name, values = s.split("=", 1)
        vals = [parse_value(v) for v in values.split(",") if v != ""]
        if not vals:
            raise ConfigError(f"--set {name}: no values")
        if name in ("ranks", "nodes") and not all(isinstance(v, int) and v >= 1 for v in vals):
            raise ConfigError(f"--set {name}: expected positive integers, found '{values}'")
        axes[name] = vals
    return axes


def point_name(point):
    parts = []
    for k, v in point.items():
        text = re.sub(r"[^A-Za-z0-9.+]", "_", str(v))
        parts.append(f"{k}-{text}")
    return "_".join(parts) or "point"


def points_of(axes, exclude):
    names = list(axes)
    for combo in itertools.product(*(axes[n] for n in names)):
        point = dict(zip(names, combo))
        if any(all(str(point.get(k)) == str(v) for k, v in e.items()) for e in exclude):
            continue
        yield point


class Launch:
    """The placeholders of one point, its command and where its files go."""

    def __init__(self, cfg, point, args):
        self.point = point
        self.name = point_name(point)
        self.dir = os.path.join(args.results, "points", self.name)
        gpn = args.gpus_per_node or cfg.get("gpus_per_node", 8)
        if "ranks" in point:
            ranks = int(point["ranks"])
            nodes = int(point["nodes"]) if "nodes" in point else -(-ranks // gpn)
        elif "nodes" in point:
            nodes = int(point["nodes"])
            ranks = nodes * gpn
        else:
            ranks, nodes = 1, 1
        self.ranks, self.nodes, self.gpus_per_node = ranks, nodes, gpn
        self.ranks_per_node = -(-ranks // nodes)
        self.out = os.path.join(self.dir, "results.jsonl")
        values = {k: str(v) for k, v in point.items()}
        for k, v in point.items():
            if isinstance(v, int) and not isinstance(v, bool):
                if v % ranks and f"{{{k}_per_rank}}" in " ".join(cfg["command"]):
                    raise ConfigError(f"{args.config}: axis {k}={v} is not a multiple of ranks={ranks} "
                                      f"({{{k}_per_rank}} would round it)")
                values[f"{k}_per_rank"] = str(v // ranks)
        values.update(bin=os.path.join(args.build, "bin"), build=args.build, out=self.out, tag=self.name,
                      point_dir=self.dir, ranks=str(ranks), nodes=str(nodes), gpus_per_node=str(gpn),
                      ranks_per_node=str(self.ranks_per_node))
        self.program = []
        for token in cfg["command"]:
            try:
                self.program.append(token.format(**values))
            except KeyError as e:
                raise ConfigError(f"{args.config}: command token '{token}' names {e}, which is neither an axis "
                                  f"({', '.join(point) or 'none'}) nor one of bin, build, out, tag, point_dir, "
                                  f"ranks, nodes, gpus_per_node, ranks_per_node, AXIS_per_rank")
            except (ValueError, IndexError) as e:
                raise ConfigError(f"{args.config}: command token '{token}': {e}")
        if args.launcher == "mpiexec":
            self.command = shlex.split(args.mpiexec) + ["-n", str(ranks)] + self.program
        else:  # srun, also inside an sbatch script
            self.command = ["srun", "--nodes", str(nodes), "--ntasks", str(ranks),
                            "--ntasks-per-node", str(self.ranks_per_node), "--gpus-per-node", str(gpn)] + self.program

    def status(self):
        try:
            with open(os.path.join(self.dir, "status.json")) as f:
                return json.load(f)
        except (OSError, json.JSONDecodeError):
            return None


def write_json(path, obj):
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(obj, f, indent=1, sort_keys=True)
        f.write("\n")
    os.replace(tmp, path)  # a sweep killed mid-write never leaves a half status


def run_point(launch, env, timeout):
    os.makedirs(launch.dir, exist_ok=True)
    if os.path.exists(launch.out):
        os.remove(launch.out)  # the binary appends: a retried point starts from nothing
    cmd_text = shlex.join(launch.command)
    with open(os.path.join(launch.dir, "command.txt"), "w") as f:
        f.write(cmd_text + "\n")
    t0 = time.time()
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    with open(os.path.join(launch.dir, "log.txt"), "w") as log:
        try:
            rc = subprocess.run(launch.command, stdout=log, stderr=subprocess.STDOUT, env=env,
                                timeout=timeout).returncode
        except subprocess.TimeoutExpired:
            log.write(f"\nsweep: stopped after {timeout} s\n")
            rc = 124
        except OSError as e:
            log.write(f"\nsweep: cannot start {launch.command[0]}: {e.strerror}\n")
            rc = 127
    status = {"status": FINISHED if rc == 0 else "failed", "exit_status": rc, "seconds": round(time.time() - t0, 3),
              "started": started, "command": cmd_text, "host": socket.gethostname(), "point": launch.point,
              "ranks": launch.ranks, "nodes": launch.nodes, "launcher": "local"}
    if rc == 0 and not os.path.exists(launch.out):
        status["status"] = "failed"
        status["error"] = f"exit status 0 but no results in {launch.out} (does the command pass --out {{out}}?)"
    write_json(os.path.join(launch.dir, "status.json"), status)
    return status


def sbatch_script(launch, cfg, args, env):
    lines = ["#!/bin/bash",
             f"#SBATCH --job-name={cfg['name']}-{launch.name}"[:200],
             f"#SBATCH --nodes={launch.nodes}",
             f"#SBATCH --ntasks-per-node={launch.ranks_per_node}",
             f"#SBATCH --gpus-per-node={launch.gpus_per_node}",
             f"#SBATCH --time={args.time or cfg.get('time', '00:30:00')}",
             f"#SBATCH --output={os.path.abspath(os.path.join(launch.dir, 'log.txt'))}"]
    if args.partition:
        lines.append(f"#SBATCH --partition={args.partition}")
    if args.account:
        lines.append(f"#SBATCH --account={args.account}")
    status = os.path.abspath(os.path.join(launch.dir, "status.json"))
    lines += ["# written by experiments/sweeps/sweep.py; the job records its own status.json when it ends",
              "set -u", f"cd {shlex.quote(os.getcwd())}"]
    lines += [f"export {k}={shlex.quote(v)}" for k, v in sorted(cfg.get("env", {}).items())]
    lines += [f"rm -f {shlex.quote(launch.out)}",
              "t0=$(date +%s)",
              shlex.join(launch.command),
              "rc=$?",
              'if [ "$rc" = 0 ]; then s=ok; else s=failed; fi',
              f"printf '{{\"status\": \"%s\", \"exit_status\": %d, \"seconds\": %d, \"launcher\": \"sbatch\", "
              f"\"job\": \"%s\", \"host\": \"%s\"}}\\n' \"$s\" \"$rc\" $(( $(date +%s) - t0 )) "
              f"\"${{SLURM_JOB_ID:-}}\" \"$(hostname)\" > {shlex.quote(status)}.tmp && "
              f"mv {shlex.quote(status)}.tmp {shlex.quote(status)}",
              "exit $rc"]
    return "\n".join(lines) + "\n"


def collate(args, launches):
    """results.jsonl: every finished point's lines, in point order."""
    path = os.path.join(args.results, "results.jsonl")
    n = 0
    with open(path + ".tmp", "w") as out:
        for launch in launches:
            st = launch.status()
            if not st or st.get("status") != FINISHED or not os.path.exists(launch.out):
                continue
            with open(launch.out) as f:
                for line in f:
                    if line.strip():
                        out.write(line if line.endswith("\n") else line + "\n")
                        n += 1
    os.replace(path + ".tmp", path)
    return path, n


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("config", help="sweep config (JSON)")
    p.add_argument("--results", help="results folder (default results/<name>)")
    p.add_argument("--build", default="build", help="build folder: {bin} is BUILD/bin (default build)")
    p.add_argument("--set", action="append", default=[], metavar="AXIS=V1,V2", help="replace an axis' values")
    p.add_argument("--launcher", choices=["mpiexec", "srun", "sbatch"], default="mpiexec")
    p.add_argument("--mpiexec", default=os.environ.get("SPARTA_MPIEXEC", "mpiexec"),
                   help="launcher command with its flags (default $SPARTA_MPIEXEC or mpiexec)")
    p.add_argument("--gpus-per-node", type=int, help="GPUs (ranks) per node (default: the config's, else 8)")
    p.add_argument("--time", help="sbatch: time limit per point (default: the config's, else 00:30:00)")
    p.add_argument("--partition", help="sbatch: partition")
    p.add_argument("--account", help="sbatch: account")
    p.add_argument("--submit", action="store_true", help="sbatch: submit the scripts (needs sbatch on PATH)")
    p.add_argument("--timeout", type=float, default=None, help="seconds a point may run (mpiexec, srun)")
    p.add_argument("--force", action="store_true", help="rerun finished points too")
    p.add_argument("--dry-run", action="store_true", help="print each point's command; run and write nothing")
    args = p.parse_args(argv)
    try:
        cfg = load_config(args.config)
        if args.gpus_per_node is not None and args.gpus_per_node < 1:
            raise ConfigError(f"--gpus-per-node: expected >= 1, found {args.gpus_per_node}")
        axes = apply_overrides(cfg["axes"], args.set)
        args.results = args.results or os.path.join("results", cfg["name"])
        launches = [Launch(cfg, pt, args) for pt in points_of(axes, cfg.get("exclude", []))]
    except ConfigError as e:
        print(f"sweep: {e}", file=sys.stderr)
        return 2
    if not launches:
        print(f"sweep: {args.config}: no points (every point excluded?)", file=sys.stderr)
        return 2
    names = [l.name for l in launches]
    if len(set(names)) != len(names):
        print(f"sweep: {args.config}: two points share a name (repeated axis values?)", file=sys.stderr)
        return 2

    if args.dry_run:
        for l in launches:
            st = l.status()
            done = st and st.get("status") == FINISHED and not args.force
            print(("# finished: " if done else "") + shlex.join(l.command))
        return 0

    env = dict(os.environ)
    env.update(cfg.get("env", {}))
    os.makedirs(os.path.join(args.results, "points"), exist_ok=True)
    write_json(os.path.join(args.results, "sweep.json"),
               {"config": cfg, "config_path": args.config, "axes": axes, "argv": sys.argv,
                "launcher": args.launcher, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())})
    counts = {"ran ok": 0, "failed": 0, "skipped (finished)": 0, "written": 0, "submitted": 0}
    submit = args.launcher == "sbatch" and args.submit
    if submit and not shutil.which("sbatch"):
        print("sweep: --submit: sbatch is not on PATH; writing the scripts only", file=sys.stderr)
        submit = False
    for i, l in enumerate(launches, 1):
        st = l.status()
        head = f"[{i}/{len(launches)}] {l.name}:"
        if st and not args.force and (st.get("status") == FINISHED or
                                      (args.launcher == "sbatch" and st.get("status") == "submitted")):
            counts["skipped (finished)" if st.get("status") == FINISHED else "submitted"] += 1
            print(f"{head} skipped ({st.get('status')})", flush=True)
            continue
        if args.launcher == "sbatch":
            os.makedirs(l.dir, exist_ok=True)
            script = os.path.join(l.dir, "job.sbatch")
            with open(script, "w") as f:
                f.write(sbatch_script(l, cfg, args, env))
            os.chmod(script, 0o755)
            state = {"status": "written", "script": script, "point": l.point, "nodes": l.nodes, "ranks": l.ranks}
            if submit:
                r = subprocess.run(["sbatch", script], capture_output=True, text=True)
                if r.returncode == 0:
                    state.update(status="submitted", sbatch=r.stdout.strip())
                else:
                    state.update(status="failed", exit_status=r.returncode, error=r.stderr.strip())
            write_json(os.path.join(l.dir, "status.json"), state)
            key = "failed" if state["status"] == "failed" else state["status"]
            counts[key] += 1
            print(f"{head} {state['status']} {script}", flush=True)
            continue
        st = run_point(l, env, args.timeout)
        if st["status"] == FINISHED:
            counts["ran ok"] += 1
            print(f"{head} ok ({st['seconds']:.1f} s)", flush=True)
        else:
            counts["failed"] += 1
            why = st.get("error") or f"exit status {st['exit_status']}"
            print(f"{head} FAILED ({why}); log: {os.path.join(l.dir, 'log.txt')}", flush=True)
    path, n = collate(args, launches)
    summary = ", ".join(f"{v} {k}" for k, v in counts.items() if v)
    print(f"sweep {cfg['name']}: {len(launches)} point(s): {summary}; {n} result line(s) in {path}")
    return 1 if counts["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
