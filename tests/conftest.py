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
