"""Hypothesis strategies for CLI invocations that a new user might type, each tagged valid or invalid, and
the oracle that judges an outcome (used by tests/test_fuzz_cli.py and benchmarks/fuzz_cli.py).

An invocation is a `Case`: argv plus `invalid` (the strategy put a value in it that no correct program
may accept) and files to write first. The oracle (`violation`) returns what is wrong with an outcome, or
"" when it keeps the promise: exit 0 with a valid plan (for `plan`), or exit 2 with exactly one `error:`
line; never a traceback or a hang; never exit 0 when the case is invalid.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from cli_harness import Outcome, run_cli
from hypothesis import strategies as st

from autoparallel.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("tiny-llama", "tiny-gpt", "tiny-moe")
HARDWARE = ("h100-sxm", "mi300x", "a100-sxm-80gb")


@dataclass(frozen=True)
class Case:
    argv: tuple[str, ...]
    invalid: bool
    files: tuple[tuple[str, str], ...] = field(default=())   # (name, text) written into the work folder

    def materialize(self, folder: Path) -> tuple[str, ...]:
        """Write the files and replace '{dir}' in argv by the folder."""
        for name, text in self.files:
            (folder / name).write_text(text, encoding="utf-8", errors="surrogateescape")
        return tuple(a.replace("{dir}", str(folder)) for a in self.argv)


def _pick(valid: list[str], invalid: list[str], lo: int = 0, hi: int = 0) -> st.SearchStrategy[tuple[str, bool]]:
    """A value from either list, tagged invalid for the second (valid twice as likely); with hi > 0 also
    any integer around the range [lo, hi], tagged invalid outside it, so the space is never exhausted."""
    parts = [st.sampled_from(valid).map(lambda v: (v, False))] * 2
    parts.append(st.sampled_from(invalid).map(lambda v: (v, True)))
    if hi:
        parts.append(st.integers(-(2**70), 2**70).map(lambda n: (str(n), not lo <= n <= hi)))
        parts.append(st.integers(lo, min(hi, 64)).map(lambda n: (str(n), False)))
    return st.one_of(*parts)


NUMBERS_BAD = ["0", "-1", "-8", "abc", "1.5", "", "1e3", "nan", "inf", "0x10", "9" * 25, "2147483648", "1099511627776"]
GPUS = _pick(["1", "2", "4", "8", "16"], NUMBERS_BAD + ["1000001"], 1, 1_000_000)
BATCH = _pick(["1", "8", "16", "32", "64"], NUMBERS_BAD + ["16777217"], 1, 2**24)
SEQ = _pick(["16", "32", "64"], NUMBERS_BAD + ["2097153"], 1, 128)  # tiny-gpt: 128 learned positions
MEMORY = _pick(["80GB", "40GiB", "1TB", "16GB", "20KB", "2e10"],
               ["0", "0.5", "80", "-80GB", "1e309GB", "lots", "80 XB", "nanGB", "0GB", "0.1B", "2PiB", ""])
TOP = _pick(["0", "1", "3", "100"], ["-1", "101", "x", "1.5"])
TOKENS = _pick(["1e9", "1000000", "2.5e12"], ["nan", "inf", "-inf", "-1e12", "0", "1e17", "ten", "1e400"])
FIX = _pick(["tp=2", "pp=2", "dp=2", "zero=1", "recompute=full", "sp=true", "tp=2,sp=on", "mb=1", "tp=1,pp=1",
             "grad_reduce_dtype=bf16", "sp=off", "tp=2,pp=2", "zero=3,recompute=selective"],
            ["sp=maybe", "sp=banana", "sp=2", "tp=2;pp=2", "tp=8,tp=2", "tp=", "=2", "tp", "warp=2", "tp=0",
             "zero=4", "zero=-1", "recompute=sometimes", "tp=1e400", "tp=2.5", "mb=0", "tp=2,,sp=maybe",
             "grad_reduce_dtype=fp8", "sp=on,sequence_parallel=off", "pp=" + "9" * 30])


@st.composite
def cluster_case(draw: st.DrawFn) -> Case:
    """plan / compare / estimate with numbers from the tables above."""
    command = draw(st.sampled_from(["plan", "plan", "compare", "estimate"]))
    model = draw(st.sampled_from(MODELS))
    argv = [command, model]
    invalid = False
    if command == "compare":
        hw = ",".join(draw(st.lists(st.sampled_from(HARDWARE), min_size=1, max_size=2, unique=True)))
    else:
        hw = draw(st.sampled_from(HARDWARE))
    for flag, strategy, required in (("--gpus", GPUS, True), ("--global-batch", BATCH, True), ("--seq-len", SEQ, False),
                                     ("--max-memory-per-gpu", MEMORY, False)):
        if required or draw(st.booleans()):
            value, bad = draw(strategy)
            if flag == "--seq-len" and value.lstrip("-").isdigit():  # only gpt's learned positions end at 128
                bad = not 1 <= int(value) <= (128 if model == "tiny-gpt" else 2**21)
            argv += [flag, value]
            invalid |= bad
    argv += ["--hardware", hw]
    if command in ("plan", "compare") and draw(st.booleans()):
        value, bad = draw(FIX)
        argv += ["--fix", value]
        invalid |= bad
    if command == "plan":
        argv.append("--quiet")
        if draw(st.booleans()):
            value, bad = draw(TOP)
            argv += ["--top", value]
            invalid |= bad
        argv.append("--json")
    if command == "compare" and draw(st.booleans()):
        value, bad = draw(TOKENS)
        argv += ["--tokens", value]
        invalid |= bad
    if command == "estimate":
        for flag in ("--tp", "--pp", "--micro-batch"):
            if draw(st.booleans()):
                value, bad = draw(_pick(["1", "2"], ["0", "-2", "x"]))
                argv += [flag, value]
                invalid |= bad
    # the seq-len of a learned position table (tiny-gpt: 128) cannot be exceeded; the SEQ values do not
    return Case(tuple(argv), invalid)


# ---- model configs ------------------------------------------------------------------------------------
LLAMA = {"model_type": "llama", "vocab_size": 64, "hidden_size": 32, "intermediate_size": 64,
         "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 64}
GPT2 = {"model_type": "gpt2", "vocab_size": 64, "n_positions": 64, "n_embd": 32, "n_layer": 2, "n_head": 4}
QWEN2_MOE = {**LLAMA, "model_type": "qwen2_moe", "moe_intermediate_size": 16, "shared_expert_intermediate_size": 32,
             "num_experts": 4, "num_experts_per_tok": 2}
BAD_VALUES = [0, -1, -4, 10**12, 10**30, 1e300, "4096", None, True, [], {}, 1.5, "nan", float("nan")]
SIZE_KEYS = {"llama": ["vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                       "num_key_value_heads", "max_position_embeddings", "head_dim"],
             "gpt2": ["vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner"],
             "qwen2_moe": ["moe_intermediate_size", "shared_expert_intermediate_size", "num_experts",
                           "num_experts_per_tok", "num_hidden_layers"]}
FLOAT_KEYS = {"llama": ["rms_norm_eps", "rope_theta"], "gpt2": ["layer_norm_epsilon", "resid_pdrop"],
              "qwen2_moe": ["rms_norm_eps", "rope_theta"]}


def _json_or_garbage(data: object, kind: str) -> str:
    if kind == "json":
        return json.dumps(data)
    return "\n".join(f"{k}: {json.dumps(v)}" for k, v in data.items()) if isinstance(data, dict) else str(data)


@st.composite
def config_case(draw: st.DrawFn) -> Case:
    """`trace` of a model config file: a valid tiny config, or one with a bad value / broken file."""
    family = draw(st.sampled_from(["llama", "gpt2", "qwen2_moe"]))
    data = dict({"llama": LLAMA, "gpt2": GPT2, "qwen2_moe": QWEN2_MOE}[family])
    kind = draw(st.sampled_from(["json", "yaml"]))
    mutation = draw(st.sampled_from(["none", "size", "float", "drop", "garbage", "binary", "deep", "type"]))
    invalid = True
    text = None
    if mutation == "none":
        invalid = False
        if family == "llama" and draw(st.booleans()):  # harmless valid variations
            data["num_hidden_layers"] = draw(st.integers(1, 3))
            data["hidden_size"] = draw(st.sampled_from([16, 32, 64]))
    elif mutation == "size":
        key = draw(st.sampled_from(SIZE_KEYS[family]))
        data[key] = draw(st.sampled_from(BAD_VALUES))
        invalid = not ((data[key] is None and key in ("head_dim", "n_inner", "num_key_value_heads",
                                                       "max_position_embeddings"))
                       or (data[key] == 0 and key == "shared_expert_intermediate_size"))  # 0: no shared expert
    elif mutation == "float":
        key = draw(st.sampled_from(FLOAT_KEYS[family]))
        data[key] = draw(st.sampled_from([0, -1, -1e-5, "x", [], float("inf")]))
        invalid = not (key == "resid_pdrop" and data[key] == 0)
    elif mutation == "drop":
        key = draw(st.sampled_from(sorted(k for k in data if k != "max_position_embeddings")))
        data.pop(key)
        # keys with a transformers default: dropping them is valid
        invalid = key not in ("num_key_value_heads",) + (("intermediate_size",) if family == "qwen2_moe" else ())
    elif mutation == "garbage":
        text = draw(st.sampled_from(["", "[]", "null", "42", "{", "model_type: [", "- a\n- b", "\t\x00"]))
    elif mutation == "binary":
        text = draw(st.sampled_from(["\udcff\udcfe\udc80", "model_type: llama\n\udc80"]))
    elif mutation == "deep":
        text = draw(st.sampled_from(["[" * 50000, "{\"a\":" * 50000, "a:\n" + "[" * 50000]))
    else:
        data["model_type"] = draw(st.sampled_from(["bert", "", 5, "GPT2", None]))
    if text is None:
        text = _json_or_garbage({k: v for k, v in data.items()}, kind)
    name = f"config.{kind}"
    return Case(("trace", "{dir}/" + name, "--seq-len", "16", "--json"), invalid, ((name, text),))


# ---- hardware profiles -------------------------------------------------------------------------------
PROFILE_EDITS = [  # (old, new, invalid)
    ("bf16: 989 TFLOPS", "bf16: 1e-400 TFLOPS", True), ("bf16: 989 TFLOPS", "bf16: 1e1000000 TFLOPS", True),
    ("bf16: 989 TFLOPS", "bf16: 0 TFLOPS", True), ("bf16: 989 TFLOPS", "bf16: -989 TFLOPS", True),
    ("bf16: 989 TFLOPS", "bf16: 989", True), ("bf16: 989 TFLOPS", "bf16: 500 TFLOPS", False),
    ("bandwidth: 3.35 TB/s", "bandwidth: 1e-300 B/s", True), ("bandwidth: 3.35 TB/s", "bandwidth: 3.35 Tb/s", False),
    ("bandwidth: 3.35 TB/s", "bandwidth: nan TB/s", True), ("latency: 3 us", "latency: 1e300 s", True),
    ("latency: 3 us", "latency: 0 us", True), ("latency: 3 us", "latency: 30 us", False),
    ("capacity: 81559 MiB", "capacity: 1 B", True), ("capacity: 81559 MiB", "capacity: 40 GB", False),
    ("capacity: 81559 MiB", "capacity: 1e30 TB", True), ("usable_fraction: 0.95", "usable_fraction: 1e-300", True),
    ("usable_fraction: 0.95", "usable_fraction: 1.5", True), ("usable_fraction: 0.95", "usable_fraction: 0.9", False),
    ("gemm_max: 0.80", "gemm_max: 0", True), ("gemm_max: 0.80", "gemm_max: 1e-300", True),
    ("gemm_half_flops: 6.3e+9", "gemm_half_flops: 1e300", True), ("kernel_overhead_us: 4", "kernel_overhead_us: -4", True),
    ("kernel_overhead_us: 4", "kernel_overhead_us: 1e300", True), ("devices_per_node: 8", "devices_per_node: 0", True),
    ("devices_per_node: 8", "devices_per_node: 4", False), ("name: h100-sxm", "name: ''", True),
    ("confidence: high", "confidence: sure", True), ("bf16: 989 TFLOPS", "bf16: 989 TFLOPS\n  bf16: 1 TFLOPS", True),
]


@st.composite
def profile_case(draw: st.DrawFn) -> Case:
    """`profiles validate` or `plan --hardware FILE` on an edited shipped profile."""
    base = (ROOT / "hardware_profiles" / "h100-sxm.yaml").read_text()
    edits = draw(st.lists(st.sampled_from(PROFILE_EDITS), min_size=1, max_size=2, unique_by=lambda e: e[0]))
    text, invalid = base, False
    for old, new, bad in edits:
        text = text.replace(old, new, 1)
        invalid |= bad
    if draw(st.booleans()):
        argv = ("profiles", "validate", "{dir}/hw.yaml")
    else:
        argv = ("plan", "tiny-llama", "--hardware", "{dir}/hw.yaml", "--gpus", "8", "--global-batch", "16",
                "--seq-len", "32", "--quiet", "--json")
    return Case(argv, invalid, (("hw.yaml", text),))


# ---- plan files ---------------------------------------------------------------------------------------
PLAN_EDITS: list[tuple[str, object, bool]] = [  # (field, value, invalid)
    ("placements", ["colwise"], True), ("recompute", 5, True), ("recompute", "none", True),
    ("stage_layers", ["a"], True), ("stage_layers", [-4, 8], True), ("stage_layers", [1, 2, 3], True),
    ("sequence_parallel", "maybe", True), ("param_dtype", "fp7", True), ("grad_reduce_dtype", 16, True),
    ("placements", {"layers.99.nope": "colwise"}, True), ("placements", {"lm_head": "diagonal"}, True),
    ("gpus", True, True), ("gpus", 0, True), ("gpus", 16, True), ("zero", "3", True), ("zero", 4, True),
    ("dp", 3, True), ("micro_batch", 0, True), ("global_batch", 10**30, True), ("seq_len", -1, True),
    ("model", None, True), ("vpp", 2, True), ("recompute", ["sometimes"] * 4, True), ("zero", 1, False),
    ("grad_reduce_dtype", "bf16", False), ("recompute", ["full"] * 4, False),
]


@st.composite
def plan_file_case(draw: st.DrawFn) -> Case:
    """`estimate --plan FILE` on a plan written by the planner (tiny-llama on 8 x h100-sxm, seq 32,
    batch 16: dp8, one block per... see plan_template), with field edits or a broken file."""
    template = plan_template()
    mutation = draw(st.sampled_from(["edit", "edit", "edit", "garbage", "flag"]))
    files: tuple[tuple[str, str], ...]
    extra: tuple[str, ...] = ()
    if mutation == "edit":
        edits = draw(st.lists(st.sampled_from(PLAN_EDITS), min_size=1, max_size=2, unique_by=lambda e: e[0]))
        data = json.loads(template)
        invalid = False
        for key, value, bad in edits:
            data["plan"][key] = value
            invalid |= bad
        files = (("plan.json", json.dumps(data)),)
    elif mutation == "garbage":
        text = draw(st.sampled_from(["", "[]", "plan: 5", "{", "[" * 50000, "\udcff\udcfe", "plan:\n  model: x"]))
        files, invalid = (("plan.json", text),), True
    else:  # a flag that conflicts with the file's layout, or a different seq-len / batch
        files, invalid = (("plan.json", template),), True
        extra = draw(st.sampled_from([("--tp", "2"), ("--zero", "1"), ("--sequence-parallel",), ("--seq-len", "64"),
                                      ("--recompute", "full"), ("--micro-batch", "2")]))
    argv = ("estimate", "tiny-llama", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
            "--plan", "{dir}/plan.json", *extra)
    return Case(argv, invalid, files)


_TEMPLATE: list[str] = []


def plan_template() -> str:
    """A real plan file for tiny-llama (written once per process by the planner itself)."""
    if not _TEMPLATE:
        import tempfile
        with tempfile.TemporaryDirectory() as d:
            out = run_cli(["plan", "tiny-llama", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                           "--seq-len", "32", "--quiet", "--output", f"{d}/plan.json"])
            assert out.kind == "ok", out.err
            _TEMPLATE.append(Path(f"{d}/plan.json").read_text())
    return _TEMPLATE[0]


# ---- output paths ---------------------------------------------------------------------------------------
@st.composite
def path_case(draw: st.DrawFn) -> Case:
    """plan --output / compare --plot with paths that exist, do not, or cannot be files."""
    name = draw(st.text("abcxyz_-.", min_size=1, max_size=12).filter(lambda t: t not in (".", "..")))
    valid_out = ["{dir}/plan.yaml", "{dir}/plan.json", "{dir}/p.yml", "{dir}/" + name + ".yaml"]
    bad_out = ["{dir}", "{dir}/missing/plan.yaml", "", "/dev/full", "{dir}/" + "x" * 300, "/proc/nope/plan.yaml"]
    bad_plot = ["{dir}/out.xyz", "{dir}/chart", "", "{dir}", "{dir}/missing/c.png", "{dir}/" + name]
    if draw(st.booleans()):
        value, bad = draw(_pick(valid_out, bad_out))
        argv = ("plan", "tiny-gpt", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--seq-len",
                "32", "--quiet", "--output", value)
    else:
        value, bad = draw(st.sampled_from(bad_plot)), True
        argv = ("compare", "tiny-gpt", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                "--seq-len", "32", "--plot", value)
    return Case(argv, bad)


ANY_CASE = st.one_of(cluster_case(), config_case(), profile_case(), plan_file_case(), path_case())


# ---- the oracle -----------------------------------------------------------------------------------------
def violation(case: Case, o: Outcome) -> str:
    """What is wrong with outcome `o` of `case`, or "" when it keeps the promise."""
    if o.kind in ("traceback", "hang", "bad-error"):
        return o.kind
    if o.kind == "ok" and case.invalid:
        return "exit-0-on-invalid"
    if o.kind == "ok" and case.argv[0] == "plan" and "--json" in case.argv:
        try:
            plan = Plan.from_dict(json.loads(o.out)["plan"])
            plan.check_runnable()
        except Exception as e:  # noqa: BLE001 - any failure to read back the plan is the finding
            return f"invalid-plan: {type(e).__name__}: {e}"
    return ""


def run_case(case: Case, folder: Path, limit_s: float = 30.0) -> tuple[Outcome, str]:
    for f in folder.iterdir():
        if f.is_file():
            f.unlink()
    o = run_cli(case.materialize(folder), limit_s)
    return o, violation(case, o)
