"""The docs run as written: every `python` block of README.md and docs/*.md (except ```python no-run
signature sketches), every `autoparallel ...` command of a `bash` block, generated sample outputs up to
date (benchmarks/readme_output.py), and example docstrings naming real catalog models."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from autoparallel.specs import list_catalog

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<info>[^\n]*)\n(?P<body>.*?)^```\s*$", re.S | re.M)


def _blocks(lang: str) -> list[tuple[str, str]]:
    """(file:line, body) of every block fenced as exactly `lang`."""
    out = []
    for path in DOCS:
        text = path.read_text()
        for m in FENCE.finditer(text):
            if m["info"].strip() == lang:
                line = text[:m.start()].count("\n") + 1
                out.append((f"{path.relative_to(ROOT)}:{line}", m["body"]))
    return out


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}


PYTHON_BLOCKS = _blocks("python")
COMMANDS = [(where, part.strip()) for where, body in _blocks("bash") for line in body.splitlines()
            for part in line.split("&&") if part.strip().startswith("autoparallel ")]


def test_there_is_something_to_run():
    assert len(PYTHON_BLOCKS) >= 2 and COMMANDS


@pytest.mark.parametrize("where,code", PYTHON_BLOCKS, ids=[w for w, _ in PYTHON_BLOCKS])
def test_python_block_runs(where, code, tmp_path):
    proc = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, f"{where}:\n{proc.stderr[-3000:]}"


@pytest.mark.parametrize("where,command", COMMANDS, ids=[w for w, _ in COMMANDS])
def test_bash_command_runs(where, command, tmp_path):
    args = shlex.split(command)[1:]
    proc = subprocess.run([sys.executable, "-m", "autoparallel.cli", *args, "--quiet"], cwd=tmp_path, env=_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"{where}: {command}\n{proc.stderr[-3000:]}"


def test_readme_sample_outputs_are_current():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import readme_output
    finally:
        sys.path.pop(0)
    current = readme_output.blocks((ROOT / "README.md").read_text())
    assert set(current) == set(readme_output.SAMPLES)
    for name, body in current.items():
        fresh = readme_output.render(name)
        assert readme_output.without_wall_time(body) == readme_output.without_wall_time(fresh), (
            f"README.md output {name!r} is stale: run python benchmarks/readme_output.py")


@pytest.mark.parametrize("example", sorted((ROOT / "examples").glob("*.py")), ids=lambda p: p.name)
def test_example_docstrings_name_catalog_models(example):
    import ast
    doc = ast.get_docstring(ast.parse(example.read_text())) or ""
    names = re.findall(r"--model\s+([\w./-]+)", doc) + re.findall(r"autoparallel\.\w+\(\"([\w.-]+)\"", doc)
    # a Hugging Face hub id (owner/name) or a config path names a model outside the catalog on purpose
    unknown = [n for n in names if n not in list_catalog() and "/" not in n]
    assert not unknown, f"{example.name} docstring names models the catalog does not have: {unknown}"
