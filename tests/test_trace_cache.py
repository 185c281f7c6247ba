"""The on-disk trace cache: keys, hits, bypass, atomic writes, corrupt entries."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest

from autoparallel.api import TRACE_BATCH, trace_model
from autoparallel.specs import load_model_spec
from autoparallel.trace_cache import TraceCache, TraceKey, default_cache_dir, spec_identity

ROOT = Path(__file__).resolve().parents[1]


def _key(**kw) -> TraceKey:
    base = {"model_identity": spec_identity(load_model_spec("tiny-llama")), "batch": 1, "seq_len": 16,
            "dtype": "bfloat16"}
    return TraceKey.of(**{**base, **kw})


def test_default_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("AUTOPARALLEL_CACHE_DIR", str(tmp_path / "a"))
    assert default_cache_dir() == tmp_path / "a"
    monkeypatch.delenv("AUTOPARALLEL_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == tmp_path / "xdg" / "autoparallel"


def test_key_changes_with_what_determines_the_graph():
    k = _key()
    assert k.digest() == _key().digest()
    others = [_key(seq_len=32), _key(batch=2), _key(dtype="float32"),
              _key(model_identity=spec_identity(load_model_spec("tiny-gpt")))]
    assert len({k.digest(), *(o.digest() for o in others)}) == 5
    assert k.torch and k.tracer


def test_trace_model_stores_then_loads(tmp_path):
    cache = TraceCache(tmp_path)
    g1 = trace_model("tiny-llama", seq_len=16, cache=cache)
    assert len(list(tmp_path.glob("trace-*.pkl"))) == 1
    g2 = trace_model("tiny-llama", seq_len=16, cache=cache)
    assert g2 is not g1 and list(g2.g.nodes(data=True)) == list(g1.g.nodes(data=True))
    assert g2.summary() == g1.summary() and g2.block_class == g1.block_class


def test_no_cache_bypasses(tmp_path, monkeypatch):
    monkeypatch.setenv("AUTOPARALLEL_CACHE_DIR", str(tmp_path))
    trace_model("tiny-llama", seq_len=16, cache=False)
    assert not list(tmp_path.iterdir())
    trace_model("tiny-llama", seq_len=16)
    assert len(list(tmp_path.glob("trace-*.pkl"))) == 1


def test_corrupt_entry_is_a_miss_and_is_rewritten(tmp_path):
    cache = TraceCache(tmp_path)
    key = TraceKey.of(spec_identity(load_model_spec("tiny-llama")), TRACE_BATCH, 16, "bfloat16")
    cache.path(key).write_bytes(b"not a pickle")
    assert cache.load(key) is None
    g = trace_model("tiny-llama", seq_len=16, cache=cache)
    assert cache.load(key).summary() == g.summary()


def test_an_entry_copied_over_another_keys_is_a_miss(tmp_path):
    """tiny-llama's entry copied over tiny-gpt's file made `trace tiny-gpt` print tiny-llama's graph."""
    cache = TraceCache(tmp_path)
    llama, gpt = (TraceKey.of(spec_identity(load_model_spec(m)), TRACE_BATCH, 16, "bfloat16")
                  for m in ("tiny-llama", "tiny-gpt"))
    trace_model("tiny-llama", seq_len=16, cache=cache)
    cache.path(gpt).write_bytes(cache.path(llama).read_bytes())
    assert cache.load(gpt) is None and cache.load(llama) is not None
    assert trace_model("tiny-gpt", seq_len=16, cache=cache).model_name != trace_model(
        "tiny-llama", seq_len=16, cache=cache).model_name


def test_concurrent_writers_leave_one_whole_entry(tmp_path):
    cache = TraceCache(tmp_path)
    g = trace_model("tiny-llama", seq_len=16, cache=False)
    key = _key()
    threads = [threading.Thread(target=cache.store, args=(key, g)) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [p.name for p in tmp_path.iterdir()] == [cache.path(key).name]  # no temporary file left
    assert cache.load(key).summary() == g.summary()


def test_unwritable_cache_dir_is_skipped(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    cache = TraceCache(blocker / "sub")   # a folder under a file cannot be created
    g = trace_model("tiny-llama", seq_len=16, cache=cache)
    assert g.g.number_of_nodes() > 0


def test_module_models_are_cached_by_fingerprint(tmp_path):
    from torch import nn

    def net(width: int) -> nn.Module:
        return nn.Sequential(nn.Embedding(32, width), nn.Linear(width, 32))

    cache = TraceCache(tmp_path)
    g1 = trace_model(net(8), seq_len=8, cache=cache)
    g2 = trace_model(net(8), seq_len=8, cache=cache)     # another instance, same fingerprint: a hit
    assert len(list(tmp_path.glob("trace-*.pkl"))) == 1 and g2.summary() == g1.summary()
    trace_model(net(16), seq_len=8, cache=cache)        # other shapes: another entry
    assert len(list(tmp_path.glob("trace-*.pkl"))) == 2


def test_cli_warm_plan_does_not_import_torch(tmp_path):
    env = {"AUTOPARALLEL_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    args = [sys.executable, "-c",
            "import sys; from autoparallel.cli import main; rc = main(sys.argv[1:]); "
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH'); sys.exit(rc)",
            "plan", "tiny-llama", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
            "--seq-len", "128"]
    cold = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert cold.returncode == 0, cold.stderr
    assert cold.stdout.strip().endswith("TORCH") and "tracing tiny-llama" in cold.stderr
    warm = subprocess.run(args, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert warm.returncode == 0, warm.stderr
    assert warm.stdout.strip().endswith("NOTORCH") and "from cache" in warm.stderr
    def body(out: str) -> list[str]:  # the report without the timing line
        return [line for line in out.splitlines() if not line.startswith("solver")][:-1]
    assert body(warm.stdout) == body(cold.stdout)
    nocache = subprocess.run(args + ["--no-cache", "--quiet"], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert nocache.returncode == 0 and nocache.stderr == "" and nocache.stdout.strip().endswith("TORCH")


@pytest.mark.parametrize("argv", [["--help"], ["profiles", "list"], ["plan", "tiny-llama"]])
def test_light_commands_do_not_import_torch(argv):
    code = ("import sys; from autoparallel.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH')")
    r = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                       env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert r.stdout.strip().endswith("NOTORCH"), r.stdout + r.stderr
