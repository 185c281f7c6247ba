"""The examples run as a user runs them: a short training run works, bad input is one line and exit 2."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, timeout=300)


def test_train_gpt_example_trains_and_reports_bad_input_in_one_line():
    ok = _run("examples/train_gpt.py", "--steps", "3")
    assert ok.returncode == 0, ok.stderr
    first, last = (float(x) for x in ok.stdout.split("loss ")[-1].split(" in ")[0].split(" -> "))
    assert last < first
    bad = _run("examples/train_gpt.py", "--fix", "tp=2", "--steps", "1")
    assert bad.returncode == 2
    lines = bad.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: fix=") and "Traceback" not in bad.stderr
