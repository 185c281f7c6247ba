"""Progress on stderr (quiet with --quiet and --json) and preconditions checked before any work."""

from __future__ import annotations

import importlib.util
import sys

import pytest

import autoparallel.api
from autoparallel.cli import main

COMPARE = ("compare", "tiny-llama", "--hardware", "h100-sxm,mi300x", "--gpus", "8", "--global-batch", "32",
           "--seq-len", "128")


def _no_planning(*_a, **_k):
    raise AssertionError("rows were computed before the precondition was checked")


def test_compare_plot_without_matplotlib_fails_before_planning(monkeypatch, capsys, tmp_path):
    # a None entry in sys.modules makes `import matplotlib` raise ImportError, installed or not (patching
    # importlib.util.find_spec did not: `import` does not call it, so with matplotlib installed this test
    # planned and failed)
    for name in ("matplotlib", "matplotlib.pyplot"):
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setattr(autoparallel.api, "compare", _no_planning)
    assert main([*COMPARE, "--plot", str(tmp_path / "c.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: --plot needs matplotlib") and len(err.strip().splitlines()) == 1


def test_compare_plot_into_missing_folder_fails_before_planning(monkeypatch, capsys, tmp_path):
    if importlib.util.find_spec("matplotlib") is None:
        pytest.skip("matplotlib not installed: the other precondition fires first")
    monkeypatch.setattr(autoparallel.api, "compare", _no_planning)
    assert main([*COMPARE, "--plot", str(tmp_path / "nope" / "c.png")]) == 2
    assert "does not exist" in capsys.readouterr().err


def test_trace_progress_then_quiet(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPARALLEL_CACHE_DIR", str(tmp_path))
    assert main(["trace", "tiny-gpt", "--seq-len", "32"]) == 0
    err = capsys.readouterr().err
    assert "tracing tiny-gpt" in err and "traced" in err
    assert main(["trace", "tiny-gpt", "--seq-len", "32"]) == 0
    assert "from cache" in capsys.readouterr().err
    for flag in ("--quiet", "--json"):
        assert main(["trace", "tiny-gpt", "--seq-len", "32", "--no-cache", flag]) == 0
        assert capsys.readouterr().err == ""


def test_compare_reports_each_profile(capsys):
    assert main(list(COMPARE)) == 0
    err = capsys.readouterr().err
    assert "[1/2] planning on h100-sxm" in err and "[2/2] mi300x: OPTIMAL" in err
    assert main([*COMPARE, "--json"]) == 0
    assert capsys.readouterr().err == ""
