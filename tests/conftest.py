"""Suite-wide settings: the trace cache lives in a temporary folder, never in the user's home."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="session", autouse=True)
def _trace_cache_in_tmp(tmp_path_factory: pytest.TempPathFactory):
    # Set for the whole session (CLI subprocesses inherit it); restored afterwards.
    old = os.environ.get("AUTOPARALLEL_CACHE_DIR")
    os.environ["AUTOPARALLEL_CACHE_DIR"] = str(tmp_path_factory.mktemp("trace-cache"))
    yield
    if old is None:
        os.environ.pop("AUTOPARALLEL_CACHE_DIR", None)
    else:
        os.environ["AUTOPARALLEL_CACHE_DIR"] = old


# The modules that take longest on a two-core machine (`pytest --durations`: a four-process training matrix,
# FP8 and int8 collectives, hypothesis runs of the planner into the trainer and of the CLI), collected first:
# `pytest -n 2 --dist loadfile` (the README's test command) hands whole modules to its two workers in
# collection order, and a long module left for last would run alone while the other worker idles.
LONGEST_FIRST = ("test_low_precision", "test_hf_trainer", "test_plan_trainer_contract", "test_fuzz_cli",
                 "test_trainer_dist", "test_hf_tracing", "test_loss_matching", "test_context_parallel")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.stem, len(rank)))  # stable: the rest keep their order
