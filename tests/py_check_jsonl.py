#!/usr/bin/env python3
"""Checks a JSON-lines file of a bench: every line one JSON object with no key written twice, having every key of
--keys and the values of --equal KEY=VALUE (compared as text). Exit status 1 with the file, line and what is wrong.
    tests/py_check_jsonl.py FILE --keys program,git,... [--equal ranks=2 ...]
Run by test_experiments."""
import argparse
import json
import sys


def main():
    p = argparse.ArgumentParser()
    p.add_argument("file")
    p.add_argument("--keys", required=True)
    p.add_argument("--equal", action="append", default=[])
    a = p.parse_args()
    keys = [k for k in a.keys.split(",") if k]
    equal = dict(e.split("=", 1) for e in a.equal)
    bad = []

    def no_twice(pairs):
        seen = set()
        for k, _ in pairs:
            if k in seen:
                raise ValueError(f"key '{k}' written twice")
            seen.add(k)
        return dict(pairs)

    n = 0
    with open(a.file) as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            n += 1
            try:
                r = json.loads(line, object_pairs_hook=no_twice)
            except ValueError as e:
                bad.append(f"{a.file}:{i}: {e}")
                continue
            for k in keys:
                if k not in r:
                    bad.append(f"{a.file}:{i}: key '{k}' missing")
            for k, v in equal.items():
                got = r.get(k)
                text = json.dumps(got) if not isinstance(got, str) else got
                if text != v:
                    bad.append(f"{a.file}:{i}: {k} is {text}, expected {v}")
    if n == 0:
        bad.append(f"{a.file}: no JSON line")
    for b in bad:
        print(b, file=sys.stderr)
    print(f"{a.file}: {n} line(s), {len(bad)} problem(s)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
