"""The zero-latency request cost of two source trees, same machine, alternating: did a change cost anything?

Usage: python benchmarks/compare_trees.py OTHER_TREE [--runs 8] [--out FILE.json]
OTHER_TREE is a checkout or ``git archive`` of another commit; this checkout is the second tree.
Each run is ``aiocubie._bench.measure(6400, 7)`` in a fresh interpreter; the best per path is kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent
CODE = "import asyncio, json; from aiocubie import _bench; print(json.dumps(asyncio.run(_bench.measure(6400, 7))))"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("other", type=Path)
    parser.add_argument("--runs", type=int, default=8)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    trees = {"other": args.other.resolve(), "this": HERE}
    runs: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for _ in range(args.runs):
        for name, tree in trees.items():  # alternating: drift on a shared machine hits both alike
            env = {**os.environ, "PYTHONPATH": str(tree)}
            out = subprocess.run([sys.executable, "-c", CODE], env=env, cwd="/", capture_output=True, text=True)
            out.check_returncode()
            runs[name].append(json.loads(out.stdout))
    best = {name: {path: min(r[path] for r in results) * 1e6 for path in results[0]} for name, results in runs.items()}
    for path in best["other"]:
        other, this = best["other"][path], best["this"][path]
        print(f"{path:34s} other {other:6.2f} us  this {this:6.2f} us  this/other {this / other:.3f}")
    if args.out:
        args.out.write_text(json.dumps({"runs": runs, "best_us": best}, indent=1) + "\n")


if __name__ == "__main__":
    main()
