"""On-disk cache of traced OpGraphs, so a model is traced once per machine, not once per command.

Key (`TraceKey`): what determines the graph — the model's identity (its ModelSpec, or a fingerprint of
an nn.Module: structure, parameter shapes and dtypes, and the source files of its classes), batch,
seq_len, dtype, the installed torch version and a hash of the tracer's own source files (so editing
the tracer or the model code invalidates old entries). Computing the key for a catalog name or a
config file does not import torch: a warm `autoparallel plan` never loads it.

Location: $AUTOPARALLEL_CACHE_DIR, else $XDG_CACHE_HOME/autoparallel, else ~/.cache/autoparallel.
Concurrent runs are safe: an entry is written to a temporary file in the same directory and moved into
place with os.replace (atomic on POSIX and Windows), so a reader sees a whole entry or none. A corrupt
or unreadable entry is a miss; a cache directory that cannot be written is skipped silently (the cache
only saves time).
"""

from __future__ import annotations

import gc
import hashlib
import importlib.metadata
import inspect
import json
import os
import pickle
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from autoparallel.graph import OpGraph

if TYPE_CHECKING:
    from torch import nn

    from autoparallel.specs import ModelSpec

ENV_DIR = "AUTOPARALLEL_CACHE_DIR"
FORMAT = 3   # bump when the pickled layout of OpGraph changes in a way source hashes miss
_PACKAGE = Path(__file__).resolve().parent
# Sources whose code decides the traced graph of a spec-built model, and the module defining the pickled classes
# (an OpGraph field added there would be missing from an older entry)
_TRACER_SOURCES = ("tracer.py", "compiled_saved.py", "replicate.py", "graph.py", "specs.py", "plan.py", "hf.py", "models",
                   "../cost_models/graph.py")


def default_cache_dir() -> Path:
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg).expanduser() if xdg else Path.home() / ".cache") / "autoparallel"


def tracer_version() -> str:
    """Hash of the tracer's and the model builders' source files (and the cache format)."""
    h = hashlib.sha256(f"format {FORMAT}".encode())
    for name in _TRACER_SOURCES:
        path = _PACKAGE / name
        files = sorted(path.glob("*.py")) if path.is_dir() else [path]
        for f in files:
            h.update(f.name.encode())
            h.update(f.read_bytes())
    return h.hexdigest()[:16]


def torch_version() -> str:
    """The installed torch's version, read from package metadata unless torch is already loaded."""
    if "torch" in sys.modules:
        return str(sys.modules["torch"].__version__)
    try:
        return importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True, default=str).encode()).hexdigest()[:32]


def spec_identity(spec: ModelSpec) -> str:
    return "spec:" + _digest(spec.to_dict())


def hf_config_identity(raw: dict[str, Any]) -> str:
    """A config transformers builds (specs.HFConfig): its keys and the installed transformers' version (read
    from package metadata: a warm plan imports neither transformers nor torch)."""
    try:
        version = importlib.metadata.version("transformers")
    except importlib.metadata.PackageNotFoundError:
        version = "absent"
    return "hfconfig:" + _digest({"config": raw, "transformers": version})


def module_identity(model: nn.Module) -> str | None:
    """Fingerprint of an nn.Module: its printed structure, parameters and buffers (name, shape,
    dtype, requires_grad) and the source files of every module class in it. None when a class's
    source cannot be read (defined interactively): such a model is traced every time."""
    sources: dict[str, str] = {}
    for m in model.modules():
        cls = type(m)
        name = f"{cls.__module__}.{cls.__qualname__}"
        if name in sources:
            continue
        try:
            sources[name] = hashlib.sha256(Path(inspect.getsourcefile(cls) or "").read_bytes()).hexdigest()
        except (OSError, TypeError):
            return None
    params = [(n, list(p.shape), str(p.dtype), p.requires_grad) for n, p in model.named_parameters()]
    bufs = [(n, list(b.shape), str(b.dtype)) for n, b in model.named_buffers()]
    # a Hugging Face model's config holds what its repr does not show (sliding windows, rope scaling, softcaps)
    config = getattr(model, "config", None)
    settings = config.to_dict() if callable(getattr(config, "to_dict", None)) else None
    return "module:" + _digest({"repr": repr(model), "params": params, "buffers": bufs, "sources": sources,
                                "training": model.training, "config": settings})


@dataclass(frozen=True)
class TraceKey:
    model: str
    batch: int
    seq_len: int
    dtype: str
    torch: str
    tracer: str

    @classmethod
    def of(cls, model_identity: str, batch: int, seq_len: int, dtype: str) -> TraceKey:
        return cls(model_identity, batch, seq_len, dtype, torch_version(), tracer_version())

    def digest(self) -> str:
        return _digest(asdict(self))


@dataclass(frozen=True)
class TraceCache:
    """Traced graphs under `directory`, one file per key."""

    directory: Path

    @classmethod
    def default(cls) -> TraceCache:
        return cls(default_cache_dir())

    def path(self, key: TraceKey) -> Path:
        return self.directory / f"trace-{key.digest()}.pkl"

    def load(self, key: TraceKey) -> OpGraph | None:
        was_enabled = gc.isenabled()
        gc.disable()  # unpickling creates ~10^5 small objects: cyclic GC passes would double the time
        try:
            with open(self.path(key), "rb") as f:
                stored = pickle.load(f)
        except FileNotFoundError:
            return None
        except Exception:  # truncated, from another version, unreadable: a miss, rewritten on store
            return None
        finally:
            if was_enabled:
                gc.enable()
        # the entry names its key: a file copied or renamed over another key's is a miss, not another model's graph
        if not (isinstance(stored, tuple) and len(stored) == 2 and stored[0] == key.digest()):
            return None
        return stored[1] if isinstance(stored[1], OpGraph) else None

    def store(self, key: TraceKey, graph: OpGraph) -> bool:
        """Write atomically (temporary file + os.replace); False when the directory is not writable."""
        tmp = None
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=self.directory, prefix=".trace-", suffix=".tmp")
            with os.fdopen(fd, "wb") as f:
                pickle.dump((key.digest(), graph), f, protocol=pickle.HIGHEST_PROTOCOL)
            os.replace(tmp, self.path(key))
            return True
        except OSError:
            if tmp is not None:
                Path(tmp).unlink(missing_ok=True)
            return False
