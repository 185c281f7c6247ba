"""Regenerate the sample outputs in README.md from the commands themselves (never pasted by hand).

    python benchmarks/readme_output.py            # rewrite every marked block in README.md
    python benchmarks/readme_output.py --check    # exit 1 when a block differs from what the command prints

A generated block sits between `<!-- output: NAME -->` and `<!-- /output -->`; NAME is a key of
SAMPLES. The block shows `$ autoparallel ARGS` and the command's stdout (progress on stderr is left
out). tests/test_readme.py runs the check, ignoring the solver's wall time, which varies by machine.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"

SAMPLES: dict[str, list[str]] = {
    "plan-llama3-70b": ["plan", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--global-batch", "512",
                        "--seq-len", "4096", "--max-memory-per-gpu", "80GB"],
}
_BLOCK = re.compile(r"(<!-- output: (?P<name>[\w.-]+) -->\n)(?P<body>.*?)(<!-- /output -->)", re.S)
_WALL = re.compile(r"(OPTIMAL|FEASIBLE|INFEASIBLE) in [0-9.]+ s")


def render(name: str) -> str:
    """The fenced block for SAMPLES[name]: the command line and its stdout."""
    args = SAMPLES[name]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.run([sys.executable, "-m", "autoparallel.cli", *args, "--quiet"], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"autoparallel {' '.join(args)} failed:\n{proc.stderr}")
    return f"```\n$ autoparallel {' '.join(args)}\n{proc.stdout.rstrip()}\n```\n"


def blocks(text: str) -> dict[str, str]:
    """NAME -> current body of each generated block in text."""
    return {m["name"]: m["body"] for m in _BLOCK.finditer(text)}


def without_wall_time(block: str) -> str:
    return _WALL.sub(r"\1 in * s", block)


def update(text: str) -> str:
    return _BLOCK.sub(lambda m: m.group(1) + render(m["name"]) + m.group(4), text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    args = ap.parse_args()
    text = README.read_text()
    if args.check:
        stale = [n for n, body in blocks(text).items() if without_wall_time(body) != without_wall_time(render(n))]
        for n in stale:
            print(f"README.md: output block {n!r} is stale; run python benchmarks/readme_output.py", file=sys.stderr)
        return 1 if stale else 0
    README.write_text(update(text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
