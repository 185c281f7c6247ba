"""Read, validate, list, show and write hardware profile YAML files.

A profile file is one mapping (see a100-sxm-80gb.yaml for the full form). Validation is strict: every
field is required unless marked optional, unknown fields are errors (a typo must not silently fall back
to a default), quantities carry units, fractions lie in (0, 1]. Every failure is one UserError line:
``hardware profile FILE: field DOTTED.PATH: problem; expected FORM``.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import re
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hardware_profiles import units
from hardware_profiles.errors import UserError, check_reference, did_you_mean
from hardware_profiles.profile import Efficiency, HardwareProfile

PROFILE_DIR = Path(__file__).resolve().parent
CONFIDENCE_LEVELS = ("high", "medium", "low")
# Smallest achieved fraction of a peak: a CPU measured against an accelerator profile reaches ~1%
# (calibrate); far below that a value is a typo.
MIN_FRACTION = 1e-4
# Written in this order (widest-used first); every canonical key of DTYPE_ALIASES appears once.
COMPUTE_DTYPES = ("bf16", "fp16", "fp8", "fp6", "fp4", "tf32", "fp32", "fp64", "int8")


class _FieldError(Exception):
    """Raised inside validation; turned into one UserError naming file and field."""

    def __init__(self, field: str, problem: str, expected: str = "") -> None:
        super().__init__(field, problem, expected)
        self.field, self.problem, self.expected = field, problem, expected


# ---- field kinds: each returns the SI value or raises _FieldError -------------------------------------
def _quantity(parse: Callable[[object], Any], lo: float, hi: float, span: str) -> Callable[[str, object], Any]:
    """A quantity with a unit, within [lo, hi] (SI): beyond what any device has, a value is a typo that
    would otherwise divide by zero or overflow in the cost model (bf16: 1e-400 TFLOPS rounds to 0)."""
    def check(field: str, value: object) -> Any:
        try:
            x = parse(value)
        except units.UnitError as e:
            raise _FieldError(field, f"{e.why} {value!r}", e.expected) from None
        if not lo <= x <= hi:
            raise _FieldError(field, f"{value!r} is outside {span}", f"a value in {span}")
        return x
    return check


def _string(field: str, value: object) -> str:
    if not isinstance(value, str) or not value.strip():
        raise _FieldError(field, f"got {value!r}", "a non-empty string")
    return value


def _number(field: str, value: object, expected: str) -> float:
    # PyYAML reads '2.0e9' (no exponent sign) as a string, so numeric strings are accepted.
    if isinstance(value, bool):
        raise _FieldError(field, f"got {value!r}", expected)
    if isinstance(value, str):
        try:
            value = float(value)
        except ValueError:
            raise _FieldError(field, f"got {value!r}", expected) from None
    if not isinstance(value, (int, float)) or value != value:
        raise _FieldError(field, f"got {value!r}", expected)
    return float(value)


def _fraction(field: str, value: object) -> float:
    form = "a number in (0, 1], e.g. 0.8"
    x = _number(field, value, form)
    if not 0 < x <= 1:
        raise _FieldError(field, f"{x!r} is outside (0, 1]", form)
    if x < MIN_FRACTION:  # 1e-300 passes (0, 1] and then overflows every cost it divides
        raise _FieldError(field, f"{x!r} is below {MIN_FRACTION:g}", f"a number in [{MIN_FRACTION:g}, 1]")
    return x


def _positive(field: str, value: object) -> float:
    # gemm_half_flops: a GEMM size in FLOPs; real devices lie near 1e9 (1e15 would make every GEMM idle).
    form = "a positive number up to 1e15, e.g. 2.0e+9"
    x = _number(field, value, form)
    if not 0 < x <= 1e15:
        raise _FieldError(field, f"{x!r} is not in (0, 1e15]", form)
    return x


def _non_negative(field: str, value: object) -> float:
    # kernel_overhead_us: microseconds per kernel launch; real ones are ~1-20 us.
    form = "a number in [0, 1e6], e.g. 4"
    x = _number(field, value, form)
    if not 0 <= x <= 1e6:
        raise _FieldError(field, f"{x!r} is outside [0, 1e6]", form)
    return x


def _positive_int(field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise _FieldError(field, f"got {value!r}", "a positive integer, e.g. 8")
    return value


def _confidence(field: str, value: object) -> str:
    if value not in CONFIDENCE_LEVELS:
        raise _FieldError(field, f"got {value!r}", " | ".join(CONFIDENCE_LEVELS))
    return str(value)


def _text(field: str, value: object) -> str:
    if not isinstance(value, str):
        raise _FieldError(field, f"got {value!r}", "a string (quote it)")
    return value


def _sources(field: str, value: object) -> tuple[str, ...]:
    form = "a non-empty list of strings (where each number comes from)"
    if not isinstance(value, list) or not value:
        raise _FieldError(field, f"got {value!r}", form)
    for i, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise _FieldError(f"{field}[{i}]", f"got {item!r}", "a non-empty string")
    return tuple(value)


def _free_mapping(field: str, value: object) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _FieldError(field, f"got {value!r}", "a mapping")
    return dict(value)


DERIVABLE = ("gemm_max", "gemm_half_flops", "memory_bound", "collective_intra", "collective_inter",
             "kernel_overhead_us")
EFFICIENCY_FIELD = {"kernel_overhead_us": "kernel_overhead_s"}  # YAML key -> Efficiency field, where they differ
# calibration entries that describe one measurement session, not the chip: never inherited (the best GEMM and copy
# rates and the collectives' rank count are the anchor's readings: an H100 would carry the H200's 4297 GB/s)
SESSION_KEYS = ("device", "date", "torch", "gemm_bf16_best_tflops", "gemm_fit_rms_log_error", "memory_best_gbps",
                "collectives")


def _derive(field: str, value: object) -> dict[str, Any]:
    """derive: {from: NAME, efficiency: [keys], calibration: true|false, why: TEXT} -- take these values
    from a measured profile of the same chip architecture instead of datasheet-era assumptions."""
    if not isinstance(value, dict) or not isinstance(value.get("from"), str) or not isinstance(value.get("why"), str):
        raise _FieldError(field, f"got {value!r}", "a mapping {from: PROFILE, efficiency: [keys], calibration: "
                                                   "true|false, why: TEXT}")
    unknown = set(value) - {"from", "efficiency", "calibration", "why"}
    if unknown:
        raise _unknown(f"{field}.{sorted(unknown)[0]}", sorted(unknown)[0], ["from", "efficiency", "calibration", "why"])
    keys = value.get("efficiency", [])
    if not isinstance(keys, list) or any(k not in DERIVABLE for k in keys):
        raise _FieldError(f"{field}.efficiency", f"got {keys!r}", f"a list of {', '.join(DERIVABLE)}")
    if not isinstance(value.get("calibration", False), bool):
        raise _FieldError(f"{field}.calibration", f"got {value.get('calibration')!r}", "true or false")
    return dict(value)


# Ranges per device, each several orders of magnitude around today's parts.
_flops = _quantity(units.parse_flops, 1e9, 1e18, "1 GFLOPS .. 1000 PFLOPS")
_bytes = _quantity(units.parse_bytes, 2**20, 2**50, "1 MiB .. 1024 TiB")
_bandwidth = _quantity(units.parse_bandwidth, 1e6, 1e15, "1 MB/s .. 1000 TB/s")
_time = _quantity(units.parse_time, 1e-12, 1.0, "1e-12 s .. 1 s")


@dataclass(frozen=True)
class _Field:
    check: Callable[[str, object], Any]
    required: bool = True


# Section name -> field name -> kind. "compute" is special: its keys are dtypes.
SCHEMA: dict[str, dict[str, _Field] | _Field] = {
    "name": _Field(_string),
    "vendor": _Field(_string),
    "model": _Field(_string),
    "compute": {dtype: _Field(_flops, required=False) for dtype in COMPUTE_DTYPES},
    "memory": {"capacity": _Field(_bytes), "usable_fraction": _Field(_fraction), "bandwidth": _Field(_bandwidth)},
    "node": {"devices_per_node": _Field(_positive_int), "link": _Field(_string),
             "bandwidth": _Field(_bandwidth), "latency": _Field(_time)},
    "network": {"bandwidth": _Field(_bandwidth), "latency": _Field(_time)},
    "software": {"collective_library": _Field(_string), "torch_backend": _Field(_string),
                 "torch_device": _Field(_string)},
    "efficiency": {"gemm_max": _Field(_fraction), "gemm_half_flops": _Field(_positive),
                   "memory_bound": _Field(_fraction), "collective_intra": _Field(_fraction),
                   "collective_inter": _Field(_fraction), "kernel_overhead_us": _Field(_non_negative)},
    "confidence": _Field(_confidence),
    "notes": _Field(_text, required=False),
    "sources": _Field(_sources),
    "calibration": _Field(_free_mapping, required=False),
    "derive": _Field(_derive, required=False),
}


def _unknown(field: str, key: object, allowed: list[str]) -> _FieldError:
    return _FieldError(field, f"unknown field {key!r}{did_you_mean(key, allowed)}", f"one of {', '.join(allowed)}")


def _validate(data: object) -> dict[str, Any]:
    """Check `data` against SCHEMA; return {dotted field: SI value}."""
    if not isinstance(data, dict):
        raise _FieldError("(top level)", f"got {type(data).__name__}", "a mapping of fields (name: ..., vendor: ...)")
    out: dict[str, Any] = {}
    for key in data:
        if key not in SCHEMA:
            raise _unknown(str(key), key, list(SCHEMA))
    for section, spec in SCHEMA.items():
        if section not in data:
            if isinstance(spec, _Field) and not spec.required:
                continue
            form = "a mapping" if isinstance(spec, dict) else "a value"
            raise _FieldError(section, "missing", form)
        value = data[section]
        if isinstance(spec, _Field):
            out[section] = spec.check(section, value)
            continue
        if not isinstance(value, dict):
            raise _FieldError(section, f"got {value!r}", f"a mapping with fields {', '.join(spec)}")
        for key in value:
            if key not in spec:
                raise _unknown(f"{section}.{key}", key, list(spec))
        for key, fld in spec.items():
            dotted = f"{section}.{key}"
            if key not in value:
                if fld.required:
                    raise _FieldError(dotted, "missing", _expected_form(fld))
                continue
            out[dotted] = fld.check(dotted, value[key])
    if not any(f"compute.{d}" in out for d in ("bf16", "fp16")):
        raise _FieldError("compute.bf16", "missing (neither bf16 nor fp16 given)", units.FLOPS_FORM)
    if "compute.fp32" not in out:
        raise _FieldError("compute.fp32", "missing", units.FLOPS_FORM)
    return out


def _expected_form(fld: _Field) -> str:
    forms = {_flops: units.FLOPS_FORM, _bytes: units.BYTES_FORM, _bandwidth: units.BANDWIDTH_FORM,
             _time: units.TIME_FORM, _fraction: "a number in (0, 1]", _positive: "a positive number up to 1e15",
             _non_negative: "a number in [0, 1e6]", _positive_int: "a positive integer", _string: "a string"}
    return forms.get(fld.check, "a value")


def _build(v: dict[str, Any], path: str | None) -> HardwareProfile:
    return HardwareProfile(
        name=v["name"], vendor=v["vendor"], model=v["model"],
        peak_flops={d: v[f"compute.{d}"] for d in COMPUTE_DTYPES if f"compute.{d}" in v},
        memory_bytes=v["memory.capacity"], usable_fraction=v["memory.usable_fraction"],
        memory_bandwidth=v["memory.bandwidth"],
        devices_per_node=v["node.devices_per_node"], intra_link=v["node.link"],
        intra_bandwidth=v["node.bandwidth"], intra_latency=v["node.latency"],
        inter_bandwidth=v["network.bandwidth"], inter_latency=v["network.latency"],
        collective_library=v["software.collective_library"], torch_backend=v["software.torch_backend"],
        torch_device=v["software.torch_device"],
        efficiency=Efficiency(
            gemm_max=v["efficiency.gemm_max"], gemm_half_flops=v["efficiency.gemm_half_flops"],
            memory_bound=v["efficiency.memory_bound"], collective_intra=v["efficiency.collective_intra"],
            collective_inter=v["efficiency.collective_inter"],
            kernel_overhead_s=v["efficiency.kernel_overhead_us"] * 1e-6),
        confidence=v["confidence"], notes=v.get("notes", ""), sources=v["sources"], path=path,
        calibration=v.get("calibration", {}),
    )


class _StrictLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # libyaml's parser where PyYAML has it
    """SafeLoader that rejects duplicate keys (PyYAML keeps the last one silently). On libyaml's parser: a
    profile is read by every plan, estimate and comparison (and a derived one reads its anchor too), and
    h100-sxm (derived from h200) took 25 ms with the pure-Python scanner against 3.4 ms."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode, deep: bool = False) -> dict:
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark)
        seen.add(key)
    return yaml.constructor.SafeConstructor.construct_mapping(loader, node, deep=deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def profile_from_yaml(text: str, where: str = "<string>", path: str | None = None) -> HardwareProfile:
    """Parse and validate profile YAML text; `where` names the source in error messages."""
    try:
        data = yaml.load(text, Loader=_StrictLoader)  # noqa: S506 - a SafeLoader subclass
    except RecursionError:
        raise UserError(f"hardware profile {where}: nested too deeply to be a profile; fix the YAML") from None
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        at = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = e.problem or e.context or "syntax error"
        raise UserError(f"hardware profile {where}: YAML syntax error{at}: {problem}; fix the YAML "
                        f"(indentation, colons, quotes)") from None
    except yaml.YAMLError as e:
        raise UserError(f"hardware profile {where}: YAML syntax error: {str(e).splitlines()[0]}") from None
    try:
        values = _validate(data)
        profile = _build(values, path)
    except _FieldError as e:
        expected = f"; expected {e.expected}" if e.expected else ""
        raise UserError(f"hardware profile {where}: field {e.field}: {e.problem}{expected}") from None
    return _apply_derivation(profile, values.get("derive"), where)


def _apply_derivation(profile: HardwareProfile, derive: dict[str, Any] | None, where: str) -> HardwareProfile:
    """The profile with the `derive` section's values taken from its anchor, and where each of its
    efficiency numbers comes from (`provenance`): measured by `autoparallel calibrate`, derived from
    the anchor's measurement, or assumed (datasheet-era defaults)."""
    measured = bool(profile.calibration.get("device")) and not derive
    # calibrate measures collectives only under torchrun on one node: the network stays sourced
    collectives = str(profile.calibration.get("collectives", "")).startswith("measured")
    prov = {k: "measured" if measured and not k.startswith("collective") else "assumed" for k in DERIVABLE}
    prov["collective_intra"] = "measured" if measured and collectives else "assumed"
    if not derive:
        return dataclasses.replace(profile, provenance=prov)
    anchor_name = derive["from"]
    if anchor_name == profile.name:
        raise UserError(f"hardware profile {where}: field derive.from: {anchor_name!r} is the profile itself; "
                        f"name a measured profile of the same chip")
    anchor = load_profile(anchor_name)
    if anchor.provenance.get("gemm_max") != "measured":
        raise UserError(f"hardware profile {where}: field derive.from: {anchor_name!r} is not a measured profile; "
                        f"derive from one written by `autoparallel calibrate`")
    # the YAML key kernel_overhead_us is the Efficiency field kernel_overhead_s; the others share names
    fields = [EFFICIENCY_FIELD.get(k, k) for k in derive.get("efficiency", [])]
    eff = {f: getattr(anchor.efficiency, f) for f in fields}
    efficiency = dataclasses.replace(profile.efficiency, **eff)
    calibration = dict(profile.calibration)
    if derive.get("calibration"):
        inherited = {k: v for k, v in anchor.calibration.items() if k not in SESSION_KEYS}
        inherited = _rates_kept(inherited, anchor, profile, efficiency.memory_bound)
        calibration = {**inherited, **calibration, "derived_from": f"{anchor_name}: {derive['why']}"}
    for k in derive.get("efficiency", []):
        prov[k] = f"derived from {anchor_name}"
    return dataclasses.replace(profile, efficiency=efficiency, calibration=calibration, provenance=prov)


# calibration entries that are one kernel family's achieved fraction of the memory bandwidth (cost_models.compute):
# a mapping of them, a mapping holding one under "fraction", or a number. Not compiled_fused_fraction: it prices
# the bytes the tracer counts for ops that Inductor fuses into kernels moving fewer, at the DRAM's speed
RATE_FRACTIONS = ("memory_fraction", "index_put_terms", "fsdp_copy_fraction", "fsdp_accumulate_fraction")


def _rates_kept(calibration: dict[str, Any], anchor: HardwareProfile, profile: HardwareProfile,
                ceiling: float) -> dict[str, Any]:
    """The anchor's bandwidth fractions as fractions of the derived part's bandwidth. A kernel family that ran
    below the DRAM ceiling (`ceiling`: memory_bound, what a bandwidth-bound op reaches) took, per byte, the
    ceiling's DRAM time plus time its SMs spent (issue rate, latency), which the same die spends too, at its
    SM clock. So, with s the anchor's bandwidth over the part's and c the part's SM clock over the anchor's
    (their bf16 peaks' ratio, the die being the same):

        1 / f_part = 1 / ceiling + (1 / f_anchor - 1 / ceiling) / (s c)           f_anchor < ceiling
        f_part = f_anchor                                                         otherwise (DRAM-bound)

    Read as is, a fraction would price an H100 (3.35 TB/s) by its bandwidth alone: calibrate's kernel families
    timed on an H100 were 25% off that way and 8% off this way (geometric means, docs/kernel_rates_h100.md), and
    the one-GPU sweep's eager rows on an H100 ran 7-10% faster than the bandwidth alone predicted
    (docs/trainer_sweep_s118.md)."""
    sc = anchor.memory_bandwidth / profile.memory_bandwidth * profile.peak("bf16") / anchor.peak("bf16")
    if math.isclose(sc, 1.0):
        return calibration

    def kept(fraction: Any) -> Any:
        if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or fraction >= ceiling or fraction <= 0:
            return fraction
        return round(1 / (1 / ceiling + (1 / fraction - 1 / ceiling) / sc), 4)

    out = dict(calibration)
    for key in RATE_FRACTIONS:
        value = out.get(key)
        if key == "memory_fraction" and isinstance(value, dict):
            out[key] = {cls: kept(f) for cls, f in value.items()}
        elif isinstance(value, dict) and "fraction" in value:
            out[key] = dict(value, fraction=kept(value["fraction"]))
        elif value is not None:
            out[key] = kept(value)
    return out


def validate_profile_file(path: str | Path) -> HardwareProfile:
    """Load and strictly validate a profile file; raise UserError naming the file and field."""
    check_reference(str(path), "hardware profile")
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"hardware profile file {p}: not found; pass an existing YAML file or a shipped "
                        f"name (`autoparallel profiles list`)") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"hardware profile file {p}: cannot read ({e}); pass a UTF-8 YAML file") from None
    return profile_from_yaml(text, where=str(p), path=str(p))


def list_profiles() -> list[str]:
    """Names of the shipped profiles (file stems in hardware_profiles/), sorted."""
    return sorted(p.stem for p in PROFILE_DIR.glob("*.yaml"))


def match_device(device_name: str, total_memory: int) -> str | None:
    """The shipped profile for a device torch names `device_name` with `total_memory` bytes: its family token (the
    name's first piece: h100, a100, mi300x, ...) must appear in the device's name; among several, the one with the
    most of its other pieces there too ("NVIDIA H100 PCIe" is h100-pcie, not the SXM part of the same memory), then
    the closest capacity (A100 40GB against 80GB)."""
    tokens = set(re.split(r"[^a-z0-9]+", device_name.lower()))
    candidates = [n for n in list_profiles() if n.split("-")[0] in tokens]
    if not candidates:
        return None

    def key(name: str) -> tuple[int, int]:
        return -len(set(name.split("-")[1:]) & tokens), abs(load_profile(name).memory_bytes - total_memory)

    return min(candidates, key=key)


def _looks_like_path(s: str) -> bool:
    return s.endswith((".yaml", ".yml")) or "/" in s or "\\" in s or Path(s).is_file()


def load_profile(name_or_path: str | Path) -> HardwareProfile:
    """A shipped profile by name (case-insensitive, e.g. 'a100-sxm-80gb') or a user YAML file by path."""
    check_reference(str(name_or_path), "hardware profile")
    if isinstance(name_or_path, Path) or _looks_like_path(str(name_or_path)):
        return validate_profile_file(name_or_path)
    name = str(name_or_path).strip().lower()
    names = list_profiles()
    if name not in names:
        # Names containing what was typed first ('a100' -> both A100s), then spelling neighbours.
        close = [n for n in names if name and name in n]
        close += [n for n in difflib.get_close_matches(name, names, n=3, cutoff=0.5) if n not in close]
        close = close[:4]
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise UserError(f"hardware profile {name_or_path!r}: unknown name; {hint}see `autoparallel profiles "
                        f"list`, or pass a path to your own YAML file")
    return validate_profile_file(PROFILE_DIR / f"{name}.yaml")


# ---- writing and showing --------------------------------------------------------------------------------
def profile_to_dict(p: HardwareProfile) -> dict[str, Any]:
    """The YAML-ready mapping of a profile (quantities as unit strings), in schema order."""
    e = p.efficiency
    d: dict[str, Any] = {
        "name": p.name, "vendor": p.vendor, "model": p.model,
        "compute": {k: units.format_flops(p.peak_flops[k]) for k in COMPUTE_DTYPES if k in p.peak_flops},
        "memory": {"capacity": units.format_bytes(p.memory_bytes), "usable_fraction": p.usable_fraction,
                   "bandwidth": units.format_bandwidth(p.memory_bandwidth)},
        "node": {"devices_per_node": p.devices_per_node, "link": p.intra_link,
                 "bandwidth": units.format_bandwidth(p.intra_bandwidth),
                 "latency": units.format_time(p.intra_latency)},
        "network": {"bandwidth": units.format_bandwidth(p.inter_bandwidth),
                    "latency": units.format_time(p.inter_latency)},
        "software": {"collective_library": p.collective_library, "torch_backend": p.torch_backend,
                     "torch_device": p.torch_device},
        "efficiency": {"gemm_max": e.gemm_max, "gemm_half_flops": e.gemm_half_flops,
                       "memory_bound": e.memory_bound, "collective_intra": e.collective_intra,
                       "collective_inter": e.collective_inter,
                       "kernel_overhead_us": _us(e.kernel_overhead_s)},
        "confidence": p.confidence,
        "notes": p.notes,
        "sources": list(p.sources),
    }
    if p.calibration:
        d["calibration"] = dict(p.calibration)
    return d


def _us(seconds: float) -> float:
    """Seconds -> microseconds, rounded so that the loader's us * 1e-6 gives the same seconds back."""
    for digits in (6, 12, 17):
        us = float(f"{seconds * 1e6:.{digits}g}")
        if us * 1e-6 == seconds:
            return us
    return seconds * 1e6


def _merge(base: dict[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in extra.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), dict):
            out[k] = _merge(out[k], v)
        else:
            out[k] = v
    return out


def profile_to_yaml(p: HardwareProfile, extra: Mapping[str, Any] | None = None) -> str:
    """YAML text of `p` that load_profile reads back to an equal profile.

    `extra` is deep-merged into the mapping before writing (e.g. {"calibration": {"date": ...,
    "gemm_tflops": ...}} or {"efficiency": {"gemm_max": 0.8}}); the result is validated, so an extra that
    breaks the schema raises UserError instead of writing an unreadable file.
    """
    data = profile_to_dict(p)
    if extra:
        data = _merge(data, extra)
    text = yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100)
    profile_from_yaml(text, where=f"generated from {p.name}")
    return text


def format_profile(p: HardwareProfile) -> str:
    """Readable multi-line view (for `autoparallel profiles show NAME`)."""
    e = p.efficiency
    peaks = ", ".join(f"{k} {v / 1e12:g}" for k, v in sorted(p.peak_flops.items(), key=lambda kv: -kv[1]))
    lines = [
        f"{p.name}: {p.vendor} {p.model}   (confidence: {p.confidence})",
        f"  compute (dense TFLOPS)  {peaks}",
        f"  memory                  {p.memory_bytes / 1e9:g} GB ({p.memory_bytes / 2**30:.1f} GiB), "
        f"usable {p.usable_fraction:g} -> {p.usable_memory_bytes / 2**30:.1f} GiB; "
        f"bandwidth {p.memory_bandwidth / 1e12:g} TB/s",
        f"  node                    {p.devices_per_node} devices, {p.intra_link}: "
        f"{p.intra_bandwidth / 1e9:g} GB/s per direction, latency {p.intra_latency * 1e6:g} us",
        f"  network (per device)    {p.inter_bandwidth / 1e9:g} GB/s per direction "
        f"({p.inter_bandwidth * 8 / 1e9:g} Gb/s), latency {p.inter_latency * 1e6:g} us",
        f"  software                {p.collective_library}; torch backend '{p.torch_backend}', "
        f"device '{p.torch_device}'",
        f"  efficiency              GEMM max {e.gemm_max:g} (half at {e.gemm_half_flops:.3g} FLOPs), "
        f"memory-bound {e.memory_bound:g}, collectives intra {e.collective_intra:g} / "
        f"inter {e.collective_inter:g}, kernel overhead {e.kernel_overhead_s * 1e6:g} us",
    ]
    if p.notes:
        lines.append(textwrap.fill(p.notes.strip(), width=100, initial_indent="  notes                   ",
                                   subsequent_indent=" " * 26))
    if p.calibration:
        lines.append(f"  calibration             {p.calibration}")
    if p.provenance:
        lines.append("  provenance              " + ", ".join(f"{k}: {v}" for k, v in p.provenance.items()))
    lines.append("  sources")
    lines += [f"    - {s}" for s in p.sources]
    if p.path:
        lines.append(f"  file                    {p.path}")
    return "\n".join(lines)
