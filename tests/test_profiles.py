"""Hardware profiles: shipped files, strict validation, unit parsing, round trips, clusters."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

import hardware_profiles
from autoparallel.errors import UserError
from hardware_profiles import (
    PROFILE_DIR,
    Cluster,
    HardwareProfile,
    format_profile,
    list_profiles,
    load_profile,
    parse_bandwidth,
    parse_bytes,
    parse_flops,
    parse_time,
    profile_from_yaml,
    profile_to_dict,
    profile_to_yaml,
    validate_profile_file,
)
from hardware_profiles.units import format_bandwidth, format_bytes, format_flops, format_time

REQUIRED = [
    "v100-sxm", "a100-sxm-40gb", "a100-sxm-80gb", "h100-sxm", "h100-pcie", "h200", "b200", "gb200", "l40s",
    "rtx-4090", "mi250x", "mi300x", "mi325x", "mi355x", "gaudi2", "gaudi3", "arc-pro-b60", "ascend-910b",
    "ascend-910c", "cambricon-mlu370-x8", "mtt-s4000", "hygon-dcu-k100", "kunlunxin-r300", "biren-br100",
    "iluvatar-bi150", "enflame-t20", "metax-c500",
]
SHIPPED = list_profiles()
BASE = (PROFILE_DIR / "a100-sxm-80gb.yaml").read_text()


# ---- shipped profiles -----------------------------------------------------------------------------------
def test_at_least_25_shipped_including_the_required_ones():
    assert len(SHIPPED) >= 25
    assert sorted(set(REQUIRED) - set(SHIPPED)) == []


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_validates_and_is_usable(name):
    p = load_profile(name)
    assert p.name == name == Path(p.path).stem
    assert validate_profile_file(p.path) == p
    # every number the cost model needs is present, positive and SI-scaled
    assert 1e12 < p.peak("bf16") < 1e17          # 1 TFLOP/s .. 100 PFLOP/s
    assert 1e12 < p.peak("fp32") < 1e16
    assert 4 * 2**30 < p.memory_bytes < 2**40      # 4 GiB .. 1 TiB
    assert 0 < p.usable_memory_bytes < p.memory_bytes
    assert 1e11 < p.memory_bandwidth < 1e14        # 0.1 .. 100 TB/s
    assert 1e9 < p.intra_bandwidth < 1e13
    assert 1e8 < p.inter_bandwidth < 1e12
    assert 1e-7 < p.intra_latency < 1e-4 and 1e-7 < p.inter_latency < 1e-4
    assert p.devices_per_node >= 1
    e = p.efficiency
    for frac in (e.gemm_max, e.memory_bound, e.collective_intra, e.collective_inter):
        assert 0 < frac <= 1
    assert e.gemm_half_flops > 0 and 0 <= e.kernel_overhead_s < 1e-3
    assert p.torch_device and p.torch_backend and p.collective_library
    assert p.sources
    if p.confidence != "high":
        assert len(p.notes) > 40, "a profile resting on estimates must say which numbers are estimates"
    # a cluster of 8 devices of every profile is valid (estimate runs llama3-8b on 8 of each)
    assert Cluster(p, 8).num_devices == 8


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profile_round_trips_through_yaml(name):
    p = load_profile(name)
    text = profile_to_yaml(p)
    q = profile_from_yaml(text)
    assert dataclasses.replace(q, path=p.path) == p
    # and the text is the schema, not a Python dump
    assert yaml.safe_load(text)["memory"]["bandwidth"].endswith("/s")


def test_format_profile_is_readable():
    p = load_profile("a100-sxm-80gb")
    text = format_profile(p)
    assert text.splitlines()[0].startswith("a100-sxm-80gb: NVIDIA A100")
    assert "bf16 312" in text and "2.039 TB/s" in text and "300 GB/s" in text
    assert "25 GB/s per direction (200 Gb/s)" in text
    assert "76.0 GiB" in text                     # 80 GiB * 0.95
    assert p.sources[0] in text


def test_known_values_are_parsed_to_si():
    p = load_profile("a100-sxm-80gb")
    assert p.peak_flops["bf16"] == 312e12
    assert p.memory_bytes == 80 * 2**30
    assert p.memory_bandwidth == 2.039e12
    assert p.inter_bandwidth == 25e9               # written as 200 Gb/s
    assert p.intra_latency == 3e-6
    assert p.efficiency.kernel_overhead_s == 4e-6
    assert p.efficiency.gemm_max == 0.87


# ---- peaks and dtypes -----------------------------------------------------------------------------------
def test_bf16_falls_back_to_fp16_on_v100():
    v100 = load_profile("v100-sxm")
    assert "bf16" not in v100.peak_flops
    assert v100.resolve_dtype("bf16") == "fp16"
    assert v100.peak("bf16") == v100.peak("fp16") == 125e12


def test_peak_accepts_torch_dtype_spellings():
    import torch

    h100 = load_profile("h100-sxm")
    assert h100.peak(torch.bfloat16) == h100.peak("bf16") == 989e12
    assert h100.peak("float32") == 67e12
    assert h100.peak(torch.float8_e4m3fn) == 1979e12


def test_missing_dtype_and_unknown_dtype_raise_user_error():
    a100 = load_profile("a100-sxm-80gb")
    with pytest.raises(UserError, match="no fp8 peak"):
        a100.peak("fp8")
    with pytest.raises(UserError, match="unknown dtype 'complex64'"):
        a100.peak("complex64")


def test_gemm_efficiency_curve():
    e = load_profile("a100-sxm-80gb").efficiency
    assert e.gemm(e.gemm_half_flops) == pytest.approx(e.gemm_max / 2)
    assert e.gemm(1e15) == pytest.approx(e.gemm_max, rel=1e-5)
    assert e.gemm(1e6) < 0.01


# ---- units ------------------------------------------------------------------------------------------------
def test_bits_versus_bytes():
    assert parse_bandwidth("200 Gb/s") == 25e9
    assert parse_bandwidth("25 GB/s") == 25e9
    assert parse_bandwidth("400 Gbps") == 50e9
    assert parse_bandwidth("800 Mb/s") == 100e6
    assert parse_bandwidth("1 GiB/s") == 2**30
    assert parse_bandwidth("2.039 TB/s") == 2.039e12
    with pytest.raises(ValueError, match="case matters"):
        parse_bandwidth("200 gb/s")


def test_other_units():
    assert parse_flops("312 TFLOPS") == 312e12
    assert parse_flops("2.5 PFLOPS") == 2.5e15
    assert parse_flops("500 GFLOPS") == 500e9
    assert parse_bytes("80 GB") == 80 * 10**9
    assert parse_bytes("80 GiB") == 80 * 2**30
    assert parse_bytes("81920 MiB") == 80 * 2**30
    assert parse_bytes("1 TB") == 10**12
    assert parse_time("3 us") == 3e-6
    assert parse_time("3 µs") == 3e-6
    assert parse_time("500 ns") == 5e-7
    assert parse_time("1.5 ms") == 1.5e-3
    assert parse_time("2 s") == 2.0


@pytest.mark.parametrize("bad", ["300", 300, "GB/s", "3 parsecs", "-1 GB/s", "0 GB/s", "1e400 GB/s", True])
def test_bad_quantities_are_rejected(bad):
    with pytest.raises(ValueError):
        parse_bandwidth(bad)


finite = st.floats(min_value=1e-12, max_value=1e18, allow_nan=False, allow_infinity=False)


@settings(database=None, max_examples=300)
@given(finite)
def test_formatted_quantities_parse_back_exactly(x):
    assert parse_flops(format_flops(x)) == x
    assert parse_bandwidth(format_bandwidth(x)) == x
    assert parse_time(format_time(x)) == x
    n = int(x) + 1
    assert parse_bytes(format_bytes(n)) == n


# ---- strict validation: one UserError naming file and field -------------------------------------------
def _write(tmp_path: Path, text: str, name: str = "bad.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    "old, new, field, what",
    [
        ("  bandwidth: 2.039 TB/s\n", "", "memory.bandwidth", "missing"),
        ("bandwidth: 300 GB/s", "bandwidth: -300 GB/s", "node.bandwidth", "must be positive"),
        ("bandwidth: 300 GB/s", "bandwidth: 0 GB/s", "node.bandwidth", "must be positive"),
        ("2.039 TB/s", "2.039 TB/fortnight", "memory.bandwidth", "unknown unit 'TB/fortnight'"),
        ("latency: 3 us", "latency: 3", "node.latency", "needs a unit"),
        ("  usable_fraction: 0.95", "  usable_fracton: 0.95", "memory.usable_fracton",
         "did you mean 'usable_fraction'"),
        ("  tf32: 156 TFLOPS", "  tf23: 156 TFLOPS", "compute.tf23", "unknown field"),
        ("gemm_max: 0.87", "gemm_max: 1.5", "efficiency.gemm_max", "outside (0, 1]"),
        ("collective_inter: 0.90", "collective_inter: 0", "efficiency.collective_inter", "outside (0, 1]"),
        ("devices_per_node: 8", "devices_per_node: eight", "node.devices_per_node", "positive integer"),
        ("devices_per_node: 8", "devices_per_node: 0", "node.devices_per_node", "positive integer"),
        ("confidence: high", "confidence: certain", "confidence", "high | medium | low"),
        ("name: a100-sxm-80gb", "name: 42", "name", "string"),
        ("  torch_device: cuda\n", "", "software.torch_device", "missing"),
    ],
)
def test_bad_profile_raises_one_line_user_error(tmp_path, old, new, field, what):
    assert old in BASE
    path = _write(tmp_path, BASE.replace(old, new, 1))
    with pytest.raises(UserError) as info:
        load_profile(str(path))
    msg = str(info.value)
    assert str(path) in msg and f"field {field}:" in msg and what in msg
    assert "\n" not in msg


def test_unknown_top_level_key(tmp_path):
    path = _write(tmp_path, BASE + "colour: green\n")
    with pytest.raises(UserError, match=r"bad\.yaml: field colour: unknown field 'colour'; expected one of name"):
        load_profile(str(path))


def test_yaml_syntax_error_names_line(tmp_path):
    lines = BASE.splitlines(keepends=True)
    lineno = next(i for i, line in enumerate(lines, 1) if "bandwidth: 300 GB/s" in line)
    lines[lineno - 1] = "  bandwidth: [300 GB/s\n"
    path = _write(tmp_path, "".join(lines))
    with pytest.raises(UserError) as info:
        validate_profile_file(path)
    msg = str(info.value)
    assert str(path) in msg and "YAML syntax error at line" in msg
    reported = int(msg.split("at line ")[1].split(",")[0])
    assert lineno <= reported <= lineno + 1


def test_duplicate_key_is_an_error(tmp_path):
    path = _write(tmp_path, BASE + "confidence: low\n")
    with pytest.raises(UserError, match="duplicate key 'confidence'"):
        load_profile(str(path))


def test_empty_sources_and_non_mapping_file(tmp_path):
    path = _write(tmp_path, BASE.split("sources:")[0] + "sources: []\n")
    with pytest.raises(UserError, match="field sources: got \\[\\]"):
        load_profile(str(path))
    with pytest.raises(UserError, match="field \\(top level\\): got list"):
        load_profile(str(_write(tmp_path, "- a\n- b\n", "list.yaml")))


def test_compute_needs_a_half_precision_and_fp32_peak(tmp_path):
    text = BASE.replace("  bf16: 312 TFLOPS\n", "").replace("  fp16: 312 TFLOPS\n", "")
    with pytest.raises(UserError, match="field compute.bf16: missing"):
        load_profile(str(_write(tmp_path, text)))
    with pytest.raises(UserError, match="field compute.fp32: missing"):
        load_profile(str(_write(tmp_path, BASE.replace("  fp32: 19.5 TFLOPS\n", ""))))


def test_missing_file_and_unknown_name(tmp_path):
    with pytest.raises(UserError, match="not found"):
        load_profile(str(tmp_path / "nope.yaml"))
    with pytest.raises(UserError) as info:
        load_profile("a100")
    assert "a100-sxm-40gb" in str(info.value) and "a100-sxm-80gb" in str(info.value)
    with pytest.raises(UserError, match="did you mean.*mi300x"):
        load_profile("mi300")


def test_user_profile_by_path_and_case_insensitive_name(tmp_path):
    path = _write(tmp_path, BASE.replace("name: a100-sxm-80gb", "name: my-cluster"), "mine.yaml")
    p = load_profile(str(path))
    assert p.name == "my-cluster" and p.path == str(path)
    assert load_profile(path).name == "my-cluster"
    assert load_profile("H100-SXM").name == "h100-sxm"


# ---- writing profiles (calibrate) ------------------------------------------------------------------------
def test_profile_to_yaml_with_calibration_extra_round_trips(tmp_path):
    p = load_profile("a100-sxm-80gb")  # a profile with no calibration of its own or inherited
    text = profile_to_yaml(p, extra={"efficiency": {"gemm_max": 0.77},
                                     "calibration": {"host": "node-1", "gemm_tflops": 761.5}})
    path = _write(tmp_path, text, "calibrated.yaml")
    q = load_profile(str(path))
    assert q.efficiency.gemm_max == 0.77
    assert q.calibration == {"host": "node-1", "gemm_tflops": 761.5}
    assert dataclasses.replace(q, efficiency=p.efficiency, path=p.path, calibration={}) == p
    assert profile_to_dict(q)["calibration"]["host"] == "node-1"


def test_profile_to_yaml_rejects_an_extra_that_breaks_the_schema():
    with pytest.raises(UserError, match="field efficiency.gemm_max"):
        profile_to_yaml(load_profile("h100-sxm"), extra={"efficiency": {"gemm_max": 2.0}})
    with pytest.raises(UserError, match="unknown field 'bogus'"):
        profile_to_yaml(load_profile("h100-sxm"), extra={"bogus": 1})


def test_round_trip_of_awkward_values():
    p = dataclasses.replace(load_profile("a100-sxm-80gb"), memory_bandwidth=1.234567891234e12,
                            intra_latency=1.1e-6, memory_bytes=143155 * 2**20,
                            peak_flops={"bf16": 312.3456789e12, "fp32": 19.5e12})
    q = profile_from_yaml(profile_to_yaml(p))
    assert dataclasses.replace(q, path=p.path) == p


# ---- clusters ---------------------------------------------------------------------------------------------
def test_cluster_shapes():
    h100 = load_profile("h100-sxm")
    c = Cluster(h100, 64)
    assert (c.num_nodes, c.devices_per_node, c.devices_in_node) == (8, 8, 8)
    single = Cluster(h100, 4)
    assert (single.num_nodes, single.devices_per_node, single.devices_in_node) == (1, 8, 4)
    small_nodes = Cluster(h100, 16, devices_per_node=4)
    assert (small_nodes.num_nodes, small_nodes.devices_per_node) == (4, 4)
    assert Cluster(load_profile("gb200"), 144).num_nodes == 2
    assert "8 node(s)" in str(c)


@pytest.mark.parametrize(
    "n, per_node, match",
    [
        (12, None, "do not fill whole nodes of 8"),
        (0, None, "positive integer"),
        (-8, None, "positive integer"),
        (8.0, None, "positive integer"),
        (True, None, "positive integer"),
        (8, 0, "devices per node 0"),
        (10, 4, "do not fill whole nodes of 4"),
    ],
)
def test_cluster_validation(n, per_node, match):
    with pytest.raises(UserError, match=match):
        Cluster(load_profile("a100-sxm-80gb"), n, devices_per_node=per_node)


def test_profiles_and_clusters_are_hashable_and_frozen():
    p = load_profile("h200")
    assert hash(p) == hash(load_profile("h200"))
    assert len({Cluster(p, 8), Cluster(load_profile("h200"), 8), Cluster(p, 16)}) == 2
    with pytest.raises(dataclasses.FrozenInstanceError):
        p.name = "x"


def test_every_dtype_alias_has_a_schema_key():
    from hardware_profiles.loader import COMPUTE_DTYPES
    from hardware_profiles.profile import DTYPE_ALIASES

    assert set(COMPUTE_DTYPES) == set(DTYPE_ALIASES.values())
    assert len(COMPUTE_DTYPES) == len(set(COMPUTE_DTYPES))


def test_efficiency_seconds_and_usable_memory_are_consistent():
    p = load_profile("h200")
    assert p.usable_memory_bytes == int(143155 * 2**20 * 0.95)
    raw = yaml.safe_load((Path(hardware_profiles.__file__).parent / "h200.yaml").read_text())
    assert math.isclose(p.efficiency.kernel_overhead_s, raw["efficiency"]["kernel_overhead_us"] * 1e-6)  # us -> s


# ---- derived profiles ---------------------------------------------------------------------------------------
def test_derived_profile_takes_the_anchors_measured_values_and_says_so():
    h100, h200 = load_profile("h100-sxm"), load_profile("h200")
    assert h100.efficiency.gemm_max == h200.efficiency.gemm_max
    assert h100.efficiency.memory_bound == h200.efficiency.memory_bound
    assert h100.calibration["attention_fwd_terms"] == h200.calibration["attention_fwd_terms"]
    # session facts and readings of the anchor's measurement stay there
    assert not {"device", "date", "memory_best_gbps", "gemm_bf16_best_tflops", "collectives"} & set(h100.calibration)
    assert h100.memory_bandwidth != h200.memory_bandwidth  # only fractions are inherited
    assert h100.provenance["gemm_max"] == "derived from h200"
    assert h100.provenance["collective_inter"] == "assumed"
    assert h200.provenance["gemm_max"] == "measured"
    assert load_profile("mi300x").provenance["gemm_max"] == "assumed"


def test_every_h100_profile_takes_its_rates_from_the_measured_h200():
    """Issue 12: an uncalibrated part takes its efficiencies from the measured anchor of its architecture; every
    shipped H100 (GH100: SXM5 80 and 96 GB, PCIe, which hardware="auto" now tells apart) derives from the H200,
    its trainer terms included."""
    h100s = [n for n in list_profiles() if n.startswith("h100")]
    assert {"h100-sxm", "h100-sxm-96gb-500w", "h100-pcie"} <= set(h100s)
    for name in h100s:
        p = load_profile(name)
        assert p.provenance["gemm_max"] == "derived from h200", name
        assert p.calibration["host_us_per_op_fwd_bwd"] == load_profile("h200").calibration["host_us_per_op_fwd_bwd"]


@pytest.mark.parametrize("derive, message", [
    ("{from: h200, efficiency: [gemm_maxx], why: x}", "derive.efficiency"),
    ("{from: a100-sxm-80gb, efficiency: [gemm_max], why: x}", "is the profile itself"),
    ("{from: mi300x, efficiency: [gemm_max], why: x}", "not a measured profile"),
    ("{from: h200, efficiency: [gemm_max]}", "derive"),
])
def test_bad_derivation_is_one_line(tmp_path, derive, message):
    path = _write(tmp_path, BASE + f"derive: {derive}\n", "derived.yaml")
    with pytest.raises(UserError, match=message):
        load_profile(str(path))


def _h100_like(tmp_path: Path, bandwidth: str = "3.35 TB/s", bf16: str = "989 TFLOPS", extra: str = "") -> HardwareProfile:
    """h100-sxm's YAML with its HBM bandwidth and bf16 peak replaced (a part of the same die, derived from h200)."""
    text = (PROFILE_DIR / "h100-sxm.yaml").read_text()
    text = text.replace("bandwidth: 3.35 TB/s", f"bandwidth: {bandwidth}").replace("bf16: 989 TFLOPS", f"bf16: {bf16}")
    return load_profile(str(_write(tmp_path, text + extra, "part.yaml")))


def _seconds_per_byte(p: HardwareProfile, fraction: float) -> float:
    return 1 / (fraction * p.memory_bandwidth)


def test_derived_part_keeps_the_anchors_sm_time_per_byte(tmp_path):
    """A kernel family below the anchor's DRAM ceiling spends, per byte, the ceiling's DRAM time plus SM time; the
    derived part (slower HBM, a lower clock) spends its own ceiling's DRAM time plus that SM time over its clock
    ratio. Checked per family against the anchor's own numbers, not against the loader's formula."""
    anchor = load_profile("h200")
    part = _h100_like(tmp_path, "2.4 TB/s", "912 TFLOPS")
    ceiling = anchor.efficiency.memory_bound
    clock = 912 / anchor.peak_flops["bf16"] * 1e12
    checked = 0
    for cls, f_anchor in anchor.calibration["memory_fraction"].items():
        f_part = part.calibration["memory_fraction"][cls]
        if f_anchor >= ceiling:
            assert f_part == f_anchor
            continue
        sm = _seconds_per_byte(anchor, f_anchor) - _seconds_per_byte(anchor, ceiling)
        expected = _seconds_per_byte(part, ceiling) + sm / clock
        assert math.isclose(_seconds_per_byte(part, f_part), expected, rel_tol=1e-3)  # fractions kept to 4 digits
        # between the anchor's rate and its fraction of the slower part's bandwidth read as is
        assert f_anchor * part.memory_bandwidth < f_part * part.memory_bandwidth < f_anchor * anchor.memory_bandwidth
        checked += 1
    assert checked >= 15
    for key in ("fsdp_copy_fraction", "fsdp_accumulate_fraction"):
        assert part.calibration[key] > anchor.calibration[key]
    assert part.calibration["index_put_terms"]["fraction"] > anchor.calibration["index_put_terms"]["fraction"]
    assert part.calibration["index_put_terms"]["fixed_us"] == anchor.calibration["index_put_terms"]["fixed_us"]
    # Inductor's fused kernels move fewer bytes than traced, at the DRAM's speed: that fraction is read as is
    assert part.calibration["compiled_fused_fraction"] == anchor.calibration["compiled_fused_fraction"]


def test_derived_part_with_the_anchors_memory_and_clock_keeps_its_fractions(tmp_path):
    anchor = load_profile("h200")
    same = _h100_like(tmp_path, "4.8 TB/s")
    assert same.calibration["memory_fraction"] == anchor.calibration["memory_fraction"]
    assert same.calibration["fsdp_copy_fraction"] == anchor.calibration["fsdp_copy_fraction"]


def test_derived_parts_own_calibration_is_not_rescaled(tmp_path):
    part = _h100_like(tmp_path, extra="calibration:\n  fsdp_copy_fraction: 0.5\n  memory_fraction: {cast: 0.3}\n")
    assert part.calibration["fsdp_copy_fraction"] == 0.5
    assert part.calibration["memory_fraction"] == {"cast": 0.3}
