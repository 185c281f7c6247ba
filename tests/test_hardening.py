"""Issue 15's reproductions, one named test each: bad input of any kind is exit 2 with one `error:` line
(never a traceback, a hang or exit 0), and the planner emits only plans the trainer accepts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from cli_harness import run_cli

from autoparallel.plan import Plan

ROOT = Path(__file__).resolve().parents[1]
B = ("--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--seq-len", "128")
LLAMA = {"model_type": "llama", "vocab_size": 256, "hidden_size": 64, "intermediate_size": 128,
         "num_hidden_layers": 2, "num_attention_heads": 8, "num_key_value_heads": 4}
GPT2 = {"model_type": "gpt2", "vocab_size": 256, "n_positions": 128, "n_embd": 64, "n_layer": 2, "n_head": 4}
QWEN2_MOE = {**LLAMA, "model_type": "qwen2_moe", "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
             "num_experts": 4, "num_experts_per_tok": 2}


def usage_error(*argv: str, needle: str = "", limit_s: float = 30.0) -> str:
    """Assert exit 2 with exactly one `error:` line (and `needle` in it); return that line."""
    o = run_cli(argv, limit_s)
    assert o.kind == "usage-error", (o.kind, o.rc, o.err[-2000:], o.escaped[-2000:])
    line = o.error_lines[0]
    assert needle in line, (needle, line)
    return line


def ok(*argv: str) -> str:
    o = run_cli(argv)
    assert o.kind == "ok", (o.rc, o.err[-2000:], o.escaped[-2000:])
    return o.out


def config(tmp_path: Path, data: dict, name: str = "config.json") -> str:
    p = tmp_path / name
    p.write_text(json.dumps(data) if name.endswith(".json") else "\n".join(f"{k}: {v}" for k, v in data.items()))
    return str(p)


def profile(tmp_path: Path, old: str, new: str) -> str:
    text = (ROOT / "hardware_profiles" / "h100-sxm.yaml").read_text()
    assert old in text, old
    p = tmp_path / "hw.yaml"
    p.write_text(text.replace(old, new))
    return str(p)


def plan_file(tmp_path: Path, **changes: object) -> str:
    """A plan file for tiny-llama on 8 x h100-sxm written by `plan`, with fields replaced."""
    path = tmp_path / "plan.json"
    ok("plan", "tiny-llama", *B, "--quiet", "--output", str(path))
    data = json.loads(path.read_text())
    data["plan"].update(changes)
    path.write_text(json.dumps(data))
    return str(path)


# ---- tracebacks --------------------------------------------------------------------------------------
def test_memory_1e309GB_is_an_error_not_overflow():
    usage_error("plan", "tiny-gpt", *B, "--max-memory-per-gpu", "1e309GB", needle="--max-memory-per-gpu")


@pytest.mark.parametrize("data", [{**LLAMA, "num_attention_heads": 0}, {**GPT2, "n_head": 0}], ids=["llama", "gpt2"])
def test_zero_attention_heads(tmp_path, data):
    usage_error("trace", config(tmp_path, data), needle="positive")


@pytest.mark.parametrize("name", ["config.json", "config.yaml"])
def test_model_config_not_utf8(tmp_path, name):
    p = tmp_path / name
    p.write_bytes(b"\xff\xfe\x00model_type: llama\x80")
    usage_error("trace", str(p), needle="UTF-8")


def test_plan_file_not_utf8(tmp_path):
    p = tmp_path / "plan.yaml"
    p.write_bytes(b"plan:\n  model: \xff\xfe\x80\n")
    usage_error("estimate", "tiny-llama", *B, "--plan", str(p), needle="UTF-8")


@pytest.mark.parametrize("name,text", [("config.json", "[" * 100000), ("config.yaml", "a:\n" + "[" * 100000),
                                       ("deep.yaml", "".join(f"{' ' * i}k{i}:\n" for i in range(3000)))],
                         ids=["json-brackets", "yaml-brackets", "yaml-indents"])
def test_deeply_nested_config(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    usage_error("trace", str(p))


def test_deeply_nested_plan_file(tmp_path):
    p = tmp_path / "plan.json"
    p.write_text("[" * 100000)
    usage_error("estimate", "tiny-llama", *B, "--plan", str(p), needle="plan file")


@pytest.mark.parametrize("key", ["hidden_size", "vocab_size", "intermediate_size", "num_hidden_layers",
                                 "num_attention_heads", "max_position_embeddings"])
@pytest.mark.parametrize("value", [10**12, 10**30])
def test_huge_config_sizes(tmp_path, key, value):
    usage_error("trace", config(tmp_path, {**LLAMA, key: value}), needle=key)


def test_negative_shared_expert_size(tmp_path):
    usage_error("trace", config(tmp_path, {**QWEN2_MOE, "shared_expert_intermediate_size": -4}),
                needle="shared_expert_intermediate_size")


@pytest.mark.parametrize("old,new", [
    ("bf16: 989 TFLOPS", "bf16: 1e-400 TFLOPS"),
    ("bandwidth: 3.35 TB/s", "bandwidth: 1e-300 B/s"),
    ("latency: 3 us", "latency: 1e300 s"),
    ("capacity: 81559 MiB", "capacity: 1 B"),
    ("usable_fraction: 0.95", "usable_fraction: 1e-300"),
    ("bf16: 989 TFLOPS", "bf16: 1e1000000 TFLOPS"),
], ids=["flops-1e-400", "bandwidth-1e-300", "latency-1e300", "capacity-1B", "usable-1e-300", "flops-1e1000000"])
def test_absurd_profile_values(tmp_path, old, new):
    hw = profile(tmp_path, old, new)
    usage_error("profiles", "validate", hw, needle="hw.yaml")
    usage_error("plan", "tiny-gpt", "--hardware", hw, "--gpus", "8", "--global-batch", "16", "--seq-len", "128",
                needle="hw.yaml")


@pytest.mark.parametrize("command", ["trace", "plan"])
def test_name_longer_than_255(command):
    name = "x" * 300
    if command == "trace":
        usage_error("trace", name, needle="255")
        usage_error("trace", name + ".json", needle="255")
    else:
        usage_error("plan", "tiny-gpt", "--hardware", name, "--gpus", "8", "--global-batch", "16", needle="255")


@pytest.mark.parametrize("where", ["directory", "missing-folder", "empty"])
def test_output_path_checked_before_planning(tmp_path, where):
    path = {"directory": str(tmp_path), "missing-folder": str(tmp_path / "no" / "plan.yaml"), "empty": ""}[where]
    t0 = time.perf_counter()
    usage_error("plan", "llama3-8b", "--hardware", "h100-sxm", "--gpus", "64", "--global-batch", "512",
                "--output", path, needle="--output")
    assert time.perf_counter() - t0 < 5  # refused before tracing and planning an 8B model


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
def test_output_to_full_disk():
    usage_error("plan", "tiny-gpt", *B, "--quiet", "--output", "/dev/full", needle="cannot write")


@pytest.mark.parametrize("path", ["out.xyz", "chart", ""])
def test_plot_path_needs_a_known_suffix(tmp_path, path):
    usage_error("compare", "tiny-gpt", *B, "--plot", str(tmp_path / path) if path else "", needle="--plot")


@pytest.mark.parametrize("changes,needle", [
    ({"placements": ["colwise"]}, "placements"),
    ({"recompute": 5}, "recompute"),
    ({"stage_layers": ["a"]}, "stage_layers"),
    ({"stage_layers": [-4, 8]}, "stage_layers"),
    ({"sequence_parallel": "maybe"}, "sequence_parallel"),
    ({"compile": "false"}, "compile"),  # priced a compiled plan
    ({"compile": [1]}, "compile"),      # a traceback (unhashable list) in the cost model
    ({"param_dtype": "fp7"}, "param_dtype"),
    ({"placements": {"layers.99.nope": "colwise"}}, "layers.99.nope"),
    ({"gpus": True}, "gpus"),
    ({"zero": "3"}, "zero"),
])
def test_malformed_plan_file(tmp_path, changes, needle):
    usage_error("estimate", "tiny-llama", *B, "--plan", plan_file(tmp_path, **changes), needle=needle)


def test_trace_batch_beyond_int64():
    usage_error("trace", "tiny-gpt", "--batch", "99999999999999999999", needle="--batch")


# ---- hangs -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("command", ["plan", "compare"])
@pytest.mark.parametrize("gpus", [str(2**31), str(2**40), "1e18"])
def test_huge_gpu_count_is_refused_quickly(command, gpus):
    usage_error(command, "tiny-gpt", "--hardware", "h100-sxm", "--gpus", gpus, "--global-batch", "16",
                "--seq-len", "128", needle="--gpus", limit_s=10)


def test_huge_global_batch_is_refused_quickly():
    usage_error("plan", "tiny-gpt", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", str(2**31),
                "--seq-len", "128", needle="--global-batch", limit_s=10)


def test_largest_accepted_cluster_plans_quickly():
    """The limits themselves do not hang: a million devices with a batch that divides them."""
    o = run_cli(["plan", "tiny-llama", "--hardware", "h100-sxm", "--gpus", "1000000", "--global-batch",
                 "1000000", "--seq-len", "16", "--quiet"], limit_s=30)
    assert o.kind in ("ok", "usage-error"), (o.kind, o.err[-1000:])


def test_hundred_thousand_layers_is_refused(tmp_path):
    usage_error("trace", config(tmp_path, {**LLAMA, "num_hidden_layers": 100000}), needle="num_hidden_layers",
                limit_s=10)


# ---- nonsense accepted ---------------------------------------------------------------------------------
@pytest.mark.parametrize("tokens", ["nan", "inf", "-1e12", "0"])
def test_compare_tokens_must_be_finite_positive(tokens):
    usage_error("compare", "tiny-gpt", *B, "--tokens", tokens, needle="--tokens")


@pytest.mark.parametrize("size", ["0.5", "80", "0.5B", "0"])
def test_memory_without_unit_is_not_the_whole_device(size):
    usage_error("plan", "tiny-gpt", *B, "--max-memory-per-gpu", size, needle="--max-memory-per-gpu")


def test_seq_len_beyond_learned_positions():
    usage_error("plan", "gpt2", *B[:-1], "4096", needle="learned positions")
    usage_error("trace", "gpt2", "--seq-len", "4096", needle="learned positions")
    usage_error("trace", "tiny-gpt", "--seq-len", "129", needle="128")


@pytest.mark.parametrize("fix,needle", [
    ("sp=maybe", "maybe"), ("sp=banana", "banana"), ("sp=2", "sp"), ("tp=2;pp=2", ";"), ("tp=8,tp=2", "twice"),
    ("tp=", "tp"), ("=2", "KEY=VALUE"), ("tp=1e400", "tp"),
])
def test_fix_strings_are_strict(fix, needle):
    usage_error("plan", "tiny-llama", *B, "--fix", fix, needle=needle)


def test_repeated_fix_flags_add_pins_and_a_repeated_pin_is_an_error():
    """`--fix tp=2 --fix pp=2` pins both (argparse alone kept only the last flag, planning what the user had not
    asked for); the same pin in two flags is the one-line error of a pin given twice."""
    plan = json.loads(ok("plan", "tiny-llama", *B, "--quiet", "--json", "--fix", "tp=2", "--fix", "zero=1"))["plan"]
    assert (plan["tp"], plan["zero"]) == (2, 1)
    for cmd in ("plan", "compare"):
        usage_error(cmd, "tiny-llama", *B, "--fix", "tp=2", "--fix", "tp=4", needle="pin tp given twice")


def test_fix_booleans_accepted():
    for value in ("true", "on", "1", "false", "off", "0", "yes", "no"):
        o = run_cli(["plan", "tiny-llama", *B, "--quiet", "--fix", f"sp={value},tp=2"])
        # accepted as a boolean (a planning error may follow: tiny-llama splits nothing at tp 2, so SP cannot run)
        assert o.kind in ("ok", "usage-error") and "pin sp=" not in "".join(o.error_lines), o.err


@pytest.mark.parametrize("top", ["-1", "101"])
def test_top_range(top):
    usage_error("plan", "tiny-llama", *B, "--top", top, needle="--top")


def test_estimate_plan_file_sets_seq_len_and_batch(tmp_path):
    path = plan_file(tmp_path)
    with_file = json.loads(ok("estimate", "tiny-llama", *B[:-2], "--plan", path, "--json"))
    assert with_file["plan"]["seq_len"] == 128
    usage_error("estimate", "tiny-llama", *B[:-1], "4096", "--plan", path, needle="--seq-len")
    usage_error("estimate", "tiny-llama", *B[:-3], "32", "--seq-len", "128", "--plan", path, needle="--global-batch")
    for flag in (("--tp", "2"), ("--zero", "1"), ("--sequence-parallel",), ("--recompute", "full")):
        usage_error("estimate", "tiny-llama", *B, "--plan", path, *flag, needle=flag[0])


def test_factory_calling_sys_exit(tmp_path, monkeypatch):
    (tmp_path / "exiting_factory.py").write_text("import sys\n\ndef make():\n    sys.exit(3)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    usage_error("trace", "exiting_factory:make", needle="SystemExit")


@pytest.mark.parametrize("key,value", [("rms_norm_eps", -1), ("rope_theta", 0), ("rms_norm_eps", "nan")])
def test_nonpositive_norm_eps_and_rope_theta(tmp_path, key, value):
    usage_error("trace", config(tmp_path, {**LLAMA, key: value}), needle=key)


def test_yaml_exponent_without_dot_is_a_number(tmp_path):
    """PyYAML reads `1e-5` as a string; the config reader accepts it as the profile loader does."""
    ok("trace", config(tmp_path, {**LLAMA, "rms_norm_eps": "1e-5"}, name="config.yaml"), "--seq-len", "16")


# ---- planner <-> trainer contract ----------------------------------------------------------------------
def test_pipeline_gets_at_least_pp_micro_batches(tmp_path):
    path = tmp_path / "plan.yaml"
    o = run_cli(["plan", "tiny-llama", "--hardware", "h100-sxm", "--gpus", "4", "--global-batch", "8", "--seq-len",
                 "16", "--fix", "pp=2,dp=2", "--quiet", "--output", str(path)])
    assert o.kind in ("ok", "usage-error"), o.err
    if o.kind == "ok":
        plan = Plan.load(path)
        assert plan.num_micro_batches >= plan.pp
        plan.check_runnable()


@pytest.mark.parametrize("model", ["tiny-gpt", "tiny-llama", "tiny-moe"])
def test_pinned_tp_plan_splits_a_module(model):
    import autoparallel
    plan = autoparallel.plan(model, hardware="h100-sxm", gpus=4, global_batch=8, seq_len=16, fix={"dp": 2, "tp": 2})
    assert plan.tp == 2 and {"colwise", "rowwise"} <= set(plan.placements.values())
    plan.check_runnable()


def test_solver_status_is_feasible_when_a_solve_is_unproven(monkeypatch):
    """StageModel.proven is read: a configuration solve that stopped at its limit makes the run FEASIBLE."""
    from autoparallel import planner as planner_mod
    from autoparallel.api import plan_result
    real = planner_mod.StageModel.solve

    def unproven(self, below=float("inf"), time_limit_s=20.0):
        plan = real(self, below, time_limit_s)
        self.proven = False
        return plan
    monkeypatch.setattr(planner_mod.StageModel, "solve", unproven)
    result, _ = plan_result("tiny-llama", hardware="h100-sxm", gpus=8, global_batch=16, seq_len=128)
    assert result.solver.status == "FEASIBLE"
    monkeypatch.undo()
    result, _ = plan_result("tiny-llama", hardware="h100-sxm", gpus=8, global_batch=16, seq_len=128)
    assert result.solver.status == "OPTIMAL"


def test_calibrate_measurements_deeply_nested(tmp_path):
    p = tmp_path / "m.json"
    p.write_text("[" * 100000)
    usage_error("calibrate", "--from-measurements", str(p), "--output", str(tmp_path / "c.yaml"), needle="m.json")


def test_calibrate_output_checked_before_measuring(tmp_path):
    usage_error("calibrate", "--output", str(tmp_path / "no" / "c.yaml"), needle="--output")


def test_a_module_level_trace_is_reported_by_every_plan_even_from_the_cache(tmp_path):
    """JetMoE routes by token counts it reads back to the host (.tolist()): it traces at module level only, its
    FLOPs stop there, so the plan's numbers are lower bounds. The text report and --json say so on every run, the
    second (from the trace cache, which keeps the graph's warnings) as the first, and stderr carries one
    `warning:` line each."""
    import os
    import subprocess
    import sys
    pytest.importorskip("transformers")
    cfg = config(tmp_path, {"model_type": "jetmoe", "vocab_size": 256, "hidden_size": 64, "num_hidden_layers": 2,
                            "num_attention_heads": 4, "num_key_value_heads": 2, "kv_channels": 16,
                            "intermediate_size": 128, "num_local_experts": 4, "num_experts_per_tok": 2})
    env = {**os.environ, "AUTOPARALLEL_CACHE_DIR": str(tmp_path / "cache")}
    argv = [sys.executable, "-m", "autoparallel.cli", "plan", cfg, "--hardware", "h200", "--gpus", "1",
            "--global-batch", "2", "--seq-len", "16", "--quiet"]
    # the first run traces (and reports in --json), the second reads the cache (and reports in text)
    js = subprocess.run([*argv, "--json"], capture_output=True, text=True, env=env, timeout=300)
    assert js.returncode == 0 and "module level" in json.loads(js.stdout)["warnings"][0], js.stderr[-1000:]
    assert any((tmp_path / "cache").iterdir())
    text = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300)
    assert text.returncode == 0, text.stderr[-2000:]
    assert "lower bounds" in text.stdout.splitlines()[-1], text.stdout[-500:]
    for run in (js, text):
        warned = [line for line in run.stderr.splitlines() if "module level" in line]
        assert len(warned) == 1 and warned[0].startswith("warning: "), run.stderr[-1000:]


def test_an_infeasible_pinned_recompute_is_explained_with_that_recompute():
    """The INFEASIBLE line names the closest configuration's footprint and the budget that would take it. With
    recompute pinned, that footprint is the pinned mode's: it said full recompute's, which fit, and asked for a
    budget under which the pinned plan still did not (Llama 4 Scout's widths on one H200, s54's preparation).
    Taking the budget it asks for must make the same pinned command plan."""
    import re
    argv = ("plan", "tiny-llama", "--hardware", "h200", "--gpus", "1", "--global-batch", "8", "--seq-len", "256",
            "--fix", "micro_batch=8,recompute=none,compile=0")
    free = json.loads(ok(*argv, "--quiet", "--json"))
    need = free["predicted"]["peak_memory_gib"]
    line = usage_error(*argv, "--max-memory-per-gpu", f"{need * 0.8 * 2**30:.0f}", needle="recompute pinned to none")
    asked = re.search(r"--max-memory-per-gpu (\d+)GB", line)
    assert asked, line
    ok(*argv, "--quiet", "--max-memory-per-gpu", f"{asked.group(1)}GB")


def test_padded_planning_of_a_model_that_takes_no_mask_is_one_error_line():
    """--padded prices the attention mask a padded batch hands a Hugging Face model built by transformers; a
    catalog model (autoparallel's own implementation) takes none, so the flag is one error line and exit 2,
    before any planning."""
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "autoparallel.cli", "plan", "tiny-llama", "--hardware", "h200",
                        "--gpus", "1", "--global-batch", "4", "--seq-len", "64", "--padded", "--no-cache"],
                       capture_output=True, text=True, timeout=300)
    lines = [ln for ln in r.stderr.splitlines() if ln.startswith("error:")]
    assert r.returncode == 2 and len(lines) == 1 and "Traceback" not in r.stderr
    assert "padded batches carry an attention mask" in lines[0] and "plan without padding" in lines[0]


def test_a_one_layer_model_has_one_block():
    """A config with num_hidden_layers 1 was traced with no blocks: `estimate` at pp = 1 said "pp*vpp = 1 virtual
    stages but the model has only 0 blocks"."""
    from autoparallel.api import trace_model
    from autoparallel.specs import load_model_spec

    spec = load_model_spec({"model_type": "llama", "vocab_size": 512, "hidden_size": 64, "intermediate_size": 128,
                            "num_hidden_layers": 1, "num_attention_heads": 4, "num_key_value_heads": 2})
    graph = trace_model(spec, seq_len=32, cache=False)
    assert len(set(graph.block_class)) == 1


def test_pins_the_planner_can_meet_are_met():
    """Found by a CLI fuzz: a pinned tp whose solver layout splits nothing (tiny-llama, 1024 tokens) had no plan at
    all (sequence parallelism skipped under the fallback layout, and plain tp skipped as dominated by it); an
    int8 reduction with ZeRO left free came back from the compile post-pass at ZeRO-0, which the trainer refuses;
    a pinned SP under that fallback said the batch does not divide."""
    from autoparallel.api import plan_result
    from autoparallel.errors import UserError

    kw = dict(hardware="h100-sxm", gpus=8, global_batch=32)
    result, _ = plan_result("tiny-llama", seq_len=1024, fix="tp=2", **kw)
    assert result.plan.tp == 2
    result, _ = plan_result("tiny-llama", seq_len=256, fix="grad_reduce_dtype=int8", **kw)
    assert result.plan.grad_reduce_dtype == "int8" and result.plan.zero >= 1
    with pytest.raises(UserError, match="pins sequence_parallel and tp=2: the sharding solver splits nothing"):
        plan_result("tiny-llama", seq_len=256, fix="tp=2,sequence_parallel=1", **kw)


def test_estimate_prices_the_plan_the_planner_and_trainer_run():
    """`estimate --tp 2` of a model the solver splits nothing of priced every module replicated on both tp ranks
    (0.052 s where the planner's pinned tp=2 plan of the same layout is 0.071 s), and it priced what the trainer
    refuses (an int8 reduction at ZeRO-0)."""
    from autoparallel.api import estimate_plan, plan_result
    from autoparallel.errors import UserError

    kw = dict(hardware="h100-sxm", gpus=8, global_batch=16, seq_len=256)
    est, plan = estimate_plan("tiny-llama", tp=2, micro_batch=4, **kw)
    result, _ = plan_result("tiny-llama", fix="tp=2,compile=0,zero=0,micro_batch=4", **kw)
    assert plan.placements == result.plan.placements
    assert est.step_time_s == pytest.approx(result.estimate.step_time_s, rel=1e-9)
    with pytest.raises(UserError, match="grad_reduce_dtype=int8 needs zero >= 1"):
        estimate_plan("tiny-llama", grad_reduce_dtype="int8", **kw)


def test_infeasible_advice_never_asks_for_more_memory_than_the_device_has():
    """llama3-8b on one 24 GB card advised `--max-memory-per-gpu 121GB`, which is capped at the card's memory:
    following it gave the same error."""
    from autoparallel.api import plan_result

    result, _ = plan_result("llama3-8b", hardware="rtx-4090", gpus=1, global_batch=1, seq_len=2048)
    assert result.plan is None
    assert "more than a rtx-4090 holds (20.6 GiB usable): use more devices" in result.explanation
    assert "--max-memory-per-gpu" not in result.explanation


def test_a_plan_file_of_another_model_is_refused_by_estimate(tmp_path):
    """`estimate` priced tiny-llama's plan file on another llama (same module names, other widths) without a
    word, where the trainer refuses the plan by its model fingerprint."""
    other = config(tmp_path, {"model_type": "llama", "vocab_size": 1000, "hidden_size": 64, "intermediate_size": 128,
                              "num_hidden_layers": 4, "num_attention_heads": 4}, name="other.json")
    usage_error("estimate", other, *B, "--plan", plan_file(tmp_path), needle="was made for another model")


def test_small_cli_contracts_from_the_fuzz(tmp_path, monkeypatch):
    """`estimate --sequence-parallel` at tp 1 was dropped without a word; `compare` printed a repeated accelerator's
    row twice; `--top 0` still printed a runner-up; `--output ~/plan.yaml` passed the early check (which expands
    `~`) and failed after planning."""
    usage_error("estimate", "tiny-llama", *B, "--sequence-parallel", needle="--sequence-parallel needs --tp > 1")
    usage_error("compare", "tiny-llama", *B[2:], "--hardware", "h100-sxm,h100-sxm", needle="more than once")
    assert "runners-up" not in ok("plan", "tiny-llama", *B, "--quiet", "--top", "0")
    monkeypatch.setenv("HOME", str(tmp_path))
    from autoparallel.cli import main
    assert main(["plan", "tiny-llama", *B, "--quiet", "--output", "~/plan.yaml"]) == 0
    assert Plan.load(tmp_path / "plan.yaml").tp >= 1


def test_python_api_hardware_and_flags_of_the_wrong_kind():
    """compare(hardware="h100-sxm,mi300x") read the string letter by letter ("hardware profile 'h'"); plan(hardware=None)
    was an AttributeError inside the profile; estimate_plan(sequence_parallel="no") turned it on."""
    from autoparallel import api
    from autoparallel.errors import UserError

    rows = api.compare("tiny-gpt", hardware="h100-sxm,mi300x", gpus=8, global_batch=16, seq_len=128)
    assert [r.hardware for r in rows] == ["h100-sxm", "mi300x"]
    for bad in (None, ["h100-sxm"], 3):
        with pytest.raises(UserError, match=r"hardware: .* is not a profile name"):
            api.plan("tiny-gpt", hardware=bad, gpus=8, global_batch=16, seq_len=128)
    with pytest.raises(UserError, match=r"estimate: sequence_parallel='no' is not True or False"):
        api.estimate_plan("tiny-gpt", hardware="h100-sxm", gpus=8, global_batch=16, seq_len=128, tp=2,
                          sequence_parallel="no")
