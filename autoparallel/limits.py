"""Input limits and the checks every boundary shares (CLI, Python API, model configs, plan files).

The limits bound what a real cluster or model can be, with headroom, so that absurd input is refused in
one line before any work instead of hanging the mesh enumeration or overflowing torch. Each error is a
UserError naming what is wrong, where, and how to fix it.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

import yaml

from autoparallel.errors import UserError

# shared with hardware_profiles (the bottom layer), which checks profile names and paths too
from hardware_profiles.errors import MAX_NAME_CHARS, check_reference  # noqa: F401

# Cluster and batch: the largest training clusters are ~1e5 devices; batches are ~1e4 sequences.
MAX_GPUS = 1_000_000
MAX_GLOBAL_BATCH = 2**24
MAX_SEQ_LEN = 2**21            # 2M tokens per sequence
MAX_TRACE_BATCH = 2**16
MAX_TOP = 100                  # runner-up plans shown
MAX_TOKENS = 1e16              # tokens to train (10,000x the largest published runs)
# Model shapes: several times the largest published transformers (Llama 3 405B: 126 layers, hidden 16384,
# 128k vocabulary). MAX_LAYERS bounds trace time: the tracer runs every block, ~26 ms per tiny block.
MAX_LAYERS = 512
MAX_HIDDEN = 2**17
MAX_INTERMEDIATE = 2**20
MAX_VOCAB = 2**23
MAX_HEADS = 2**12
MAX_HEAD_DIM = 2**12
MAX_EXPERTS = 2**14
MAX_POSITIONS = 2**24
# Device memory: a budget below 1 MiB is a missing unit ("80" is 80 bytes), above 1 PiB a typo.
MIN_DEVICE_BYTES = 2**20
MAX_DEVICE_BYTES = 2**50
MAX_DOCUMENT_BYTES = 16 * 2**20  # a model config or plan file is a few KiB


def check_int(value: Any, what: str, lo: int, hi: int, fix: str = "") -> int:
    """`value` as an int in [lo, hi] (integral floats accepted), else a UserError naming `what`."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise UserError(f"{what}: {value!r} is not a whole number; {fix or f'use one in {lo}..{hi:,}'}")
    if not lo <= value <= hi:
        raise UserError(f"{what}: {value:,} is outside {lo}..{hi:,}; {fix or f'use one in {lo}..{hi:,}'}")
    return value


def check_number(value: Any, what: str, lo: float, hi: float, fix: str = "") -> float:
    """`value` as a finite float in (lo, hi], else a UserError (nan, inf and non-numbers included)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserError(f"{what}: {value!r} is not a finite number; {fix or f'use one in ({lo:g}, {hi:g}]'}")
    if not lo < value <= hi:
        raise UserError(f"{what}: {value:g} is outside ({lo:g}, {hi:g}]; {fix or f'use one in ({lo:g}, {hi:g}]'}")
    return float(value)


def check_output_path(path: str, what: str, suffixes: tuple[str, ...] = (), inputs: tuple[str | None, ...] = ()) -> Path:
    """A file path that can be written: its folder exists and is writable, it is not a folder, it is none of
    the command's `inputs` (a model's config.json, a folder's, measured probes: writing there lost them), and
    (when `suffixes` is given) its suffix is one of them. Checked before planning, so a bad path does not
    cost the whole computation."""
    if not path or not path.strip():
        raise UserError(f"{what}: empty path; pass a file name such as {'out' + (suffixes or ('.yaml',))[0]}")
    check_reference(path, what)
    p = Path(path).expanduser()
    if suffixes and p.suffix.lower() not in suffixes:
        raise UserError(f"{what} {path}: the file name must end in {' or '.join(suffixes)} (it sets the "
                        f"format); e.g. {p.with_suffix(suffixes[0]).name}")
    if p.is_dir():
        raise UserError(f"{what} {path}: is a directory; pass a file path inside it, e.g. {p / ('out' + (suffixes or ('.yaml',))[0])}")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise UserError(f"{what} {path}: folder {parent} does not exist; create it first or pick another path")
    if not os.access(parent, os.W_OK | os.X_OK) or (p.exists() and not os.access(p, os.W_OK)):
        raise UserError(f"{what} {path}: not writable; pick a path you can write")
    if p.exists():
        for given in filter(None, inputs):
            q = Path(given).expanduser()
            for source in (q, q / "config.json") if q.is_dir() else (q,):
                if source.exists() and os.path.samefile(source, p):
                    raise UserError(f"{what} {path}: is the input {given}, which writing would overwrite; "
                                    f"pick another path")
    return p


def write_text(path: str | Path, text: str, what: str) -> None:
    """Write a file; an OS failure (disk full, permissions) is one UserError line."""
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as e:
        raise UserError(f"{what} {path}: cannot write ({e.strerror or e}); pick another path") from None


def load_document(path: Path, what: str, json_only: bool = False) -> Any:
    """Parse a UTF-8 JSON or YAML file (JSON when `json_only` or the suffix is .json), with every failure
    (missing, not UTF-8, too large, syntax, nesting too deep for the parser) as one UserError line."""
    kind = "JSON" if json_only or path.suffix == ".json" else "YAML"
    try:
        if path.stat().st_size > MAX_DOCUMENT_BYTES:
            raise UserError(f"{what} {str(path)!r}: larger than {MAX_DOCUMENT_BYTES // 2**20} MiB; pass the "
                            f"config file itself")
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{what} {str(path)!r}: not UTF-8 text (byte {e.start}); save it as UTF-8 "
                        f"{kind}") from None
    except OSError as e:
        raise UserError(f"cannot read {what} {str(path)!r}: {e.strerror or e}; check the path") from None
    try:
        return json.loads(text) if kind == "JSON" else yaml.safe_load(text)
    except RecursionError:
        raise UserError(f"{what} {str(path)!r}: nested too deeply to be a {what}; fix the file") from None
    except (json.JSONDecodeError, yaml.YAMLError, ValueError) as e:
        first = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise UserError(f"{what} {str(path)!r} is not valid {kind}: {first}") from None
