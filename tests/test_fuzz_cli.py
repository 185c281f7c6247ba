"""Seeded fuzzing of the CLI (issue 15): generated invocations over numbers, pins, model configs, hardware
profiles, plan files and output paths. Every outcome must be exit 0 (with a plan the trainer accepts, for
`plan --json`) or exit 2 with exactly one `error:` line; no traceback, no hang past 30 s, and no exit 0
when the strategy put an invalid value in (tests/cli_fuzz.py has the strategies and the oracle).

derandomize=True makes every run draw the same examples (CI is reproducible); the counts add up to
2,100 invocations. benchmarks/fuzz_cli.py runs the same strategies longer.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import cli_fuzz as F
import pytest
from hypothesis import HealthCheck, given, settings

EXAMPLES = {"cluster": 800, "config": 450, "profile": 300, "plan_file": 350, "path": 200}
assert sum(EXAMPLES.values()) >= 2000


def _settings(n: int) -> settings:
    return settings(max_examples=n, derandomize=True, deadline=None, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                           HealthCheck.filter_too_much])


def _check(case: F.Case) -> None:
    with tempfile.TemporaryDirectory() as d:
        o, problem = F.run_case(case, Path(d))
    assert not problem, (problem, case.argv, o.rc, o.err[-1500:], o.escaped[-3000:])


@pytest.fixture(scope="module", autouse=True)
def _quiet_torch():
    import torch
    torch.set_num_threads(1)  # in-process: keep the shared CI cores for the other tests


@pytest.mark.parametrize("strategy", sorted(EXAMPLES))
def test_fuzz(strategy):
    """One seeded hypothesis run per strategy: cluster arguments and pins, model configs, hardware profiles,
    plan files, output paths."""
    @_settings(EXAMPLES[strategy])
    @given(getattr(F, f"{strategy}_case")())
    def check(case: F.Case) -> None:
        _check(case)
    check()
