"""The command line: JSON contracts, plan files that load back, and one-line errors with exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from autoparallel.cli import main
from autoparallel.plan import Plan


def run(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def assert_one_line_error(rc: int, err: str, *needles: str) -> None:
    assert rc == 2
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])


def test_trace_json(capsys):
    rc, out, _ = run(capsys, "trace", "tiny-gpt", "--seq-len", "64", "--batch", "2", "--json")
    d = json.loads(out)
    assert rc == 0
    for key in ("parameters", "forward_flops", "backward_flops", "num_blocks", "activation_bytes_per_block"):
        assert key in d
    assert d["backward_flops"] == pytest.approx(2 * d["forward_flops"], rel=0.1)


PLAN_ARGS = ("tiny-llama", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "32", "--seq-len", "128")


def test_estimate_json_keys(capsys):
    rc, out, _ = run(capsys, "estimate", *PLAN_ARGS, "--tp", "2", "--pp", "2", "--micro-batch", "2",
                     "--recompute", "selective", "--zero", "1", "--sequence-parallel", "--json")
    d = json.loads(out)
    assert rc == 0 and d["plan"]["dp"] == 2
    for key in ("step_time_s", "tokens_per_s", "model_tflops_per_gpu", "hardware_tflops_per_gpu", "mfu",
                "peak_memory_gib", "memory_per_stage_gib", "fits", "breakdown"):
        assert key in d["predicted"], key
    assert len(d["predicted"]["memory_per_stage_gib"]) == 2


def test_plan_json_output_file_and_estimate_roundtrip(capsys, tmp_path: Path):
    path = tmp_path / "plan.yaml"
    rc, out, _ = run(capsys, "plan", *PLAN_ARGS, "--json", "--output", str(path), "--quiet")
    d = json.loads(out)
    assert rc == 0
    assert set(d["solver"]) >= {"status", "wall_s", "objective", "bound"}
    assert d["solver"]["status"] == "OPTIMAL"
    assert set(d["predicted"]) >= {"step_time_s", "peak_memory_gib", "fits"}
    plan = Plan.load(path)
    assert plan.dp * plan.tp * plan.pp * plan.ep == 8
    rc, out, _ = run(capsys, "estimate", *PLAN_ARGS, "--plan", str(path), "--json")
    assert rc == 0
    assert json.loads(out)["predicted"]["step_time_s"] == pytest.approx(d["predicted"]["step_time_s"])


def test_plan_human_output(capsys):
    rc, out, err = run(capsys, "plan", *PLAN_ARGS, "--top", "2")
    assert rc == 0
    for needle in ("solver", "mesh", "memory per pipeline stage", "step time", "MFU", "runners-up"):
        assert needle in out
    assert "planning tiny-llama" in err  # progress goes to stderr


def test_compare_rows(capsys, tmp_path: Path):
    rc, out, _ = run(capsys, "compare", "tiny-llama", "--hardware", "h100-sxm,mi300x,ascend-910b", "--gpus", "8",
                     "--global-batch", "32", "--seq-len", "128", "--tokens", "1e9", "--json")
    rows = json.loads(out)
    assert rc == 0 and [r["hardware"] for r in rows] == ["h100-sxm", "mi300x", "ascend-910b"]
    assert all(r["feasible"] and r["time_to_train_days"] > 0 for r in rows)
    pytest.importorskip("matplotlib")
    png = tmp_path / "cmp.png"
    rc, _, _ = run(capsys, "compare", "tiny-llama", "--hardware", "h100-sxm,mi300x", "--gpus", "8",
                   "--global-batch", "32", "--seq-len", "128", "--plot", str(png))
    assert rc == 0 and png.read_bytes()[:4] == b"\x89PNG"


def test_profiles_commands(capsys, tmp_path: Path):
    rc, out, _ = run(capsys, "profiles", "list")
    assert rc == 0 and len(out.splitlines()) >= 25
    rc, out, _ = run(capsys, "profiles", "show", "h200")
    assert rc == 0 and "H200" in out
    bad = tmp_path / "bad.yaml"
    bad.write_text((Path(__file__).parents[1] / "hardware_profiles" / "h200.yaml").read_text()
                   .replace("bandwidth: 4.8 TB/s", "bandwidth: -4.8 TB/s"))
    rc, _, err = run(capsys, "profiles", "validate", str(bad))
    assert_one_line_error(rc, err, "bad.yaml", "memory.bandwidth")


@pytest.mark.parametrize("argv,needles", [
    (("trace", "llama3-7b"), ("llama3-8b",)),                                     # close names suggested
    (("trace", "/nonexistent/config.json"), ("config.json",)),
    (("estimate", *PLAN_ARGS, "--tp", "3"), ("--tp 3",)),
    (("estimate", *PLAN_ARGS, "--tp", "8"), ("heads",)),
    (("estimate", "tiny-llama", "--hardware", "nope-gpu", "--gpus", "8", "--global-batch", "32"), ("nope-gpu",)),
    (("plan", *PLAN_ARGS, "--max-memory-per-gpu", "20KB", "--quiet"), ("less than 1 MiB", "--max-memory-per-gpu")),
    (("plan", *PLAN_ARGS, "--fix", "tp=4,pp=4", "--quiet"), ("tp=4",)),
    (("plan", *PLAN_ARGS, "--fix", "warp=2", "--quiet"), ("warp",)),
    (("plan", *PLAN_ARGS, "--max-memory-per-gpu", "lots"), ("lots",)),
    (("plan", "tiny-llama", "--gpus", "8"), ("--hardware",)),
])
def test_bad_input_exits_2_with_one_line(capsys, argv, needles):
    rc, _, err = run(capsys, *argv)
    assert_one_line_error(rc, err, *needles)


def test_console_script_exit_code():
    """The installed entry point (not just main()) returns 2 on bad input."""
    proc = subprocess.run([sys.executable, "-m", "autoparallel.cli", "trace", "no-such-model"],
                          capture_output=True, text=True)
    assert proc.returncode == 2 and proc.stderr.startswith("error: ")


@pytest.mark.parametrize("content,needle", [
    ('{"model_type": "llama", "hidden_size": 64, "num_hidden_layers": "many", "num_attention_heads": 4, '
     '"intermediate_size": 128, "vocab_size": 256}', "num_hidden_layers"),
    ('{"model_type": "llama", "hidden_size": 64', "cfg.json"),
    ('{"model_type": "llama", "num_hidden_layers": 2, "num_attention_heads": 4, "vocab_size": 256}', "hidden_size"),
])
def test_bad_config_files_exit_2(capsys, tmp_path: Path, content: str, needle: str):
    cfg = tmp_path / "cfg.json"
    cfg.write_text(content)
    rc, _, err = run(capsys, "trace", str(cfg))
    assert_one_line_error(rc, err, needle)


def test_estimate_compile_prices_the_compiled_runtime(capsys):
    """--compile on estimate (and compile=1 on plan's --fix) prices torch.compile per block: where the
    profile measured compiled trainer steps (h200), the fused pointwise work makes the step shorter."""
    base = ("estimate", "tiny-llama", "--hardware", "h200", "--gpus", "1", "--global-batch", "4", "--seq-len", "64",
            "--micro-batch", "4", "--json")
    rc, eager, _ = run(capsys, *base)
    rc2, compiled, _ = run(capsys, *base, "--compile")
    assert rc == rc2 == 0
    eager, compiled = json.loads(eager), json.loads(compiled)
    assert compiled["plan"]["compile"] is True and eager["plan"]["compile"] is False
    assert compiled["predicted"]["step_time_s"] < eager["predicted"]["step_time_s"]
    rc, out, _ = run(capsys, "plan", "tiny-llama", "--hardware", "h200", "--gpus", "1", "--global-batch", "4",
                     "--seq-len", "64", "--fix", "compile=1", "--json")
    assert rc == 0 and json.loads(out)["plan"]["compile"] is True


def test_clip_grad_norm_prices_the_trainers_clipping(capsys, tmp_path):
    """--clip-grad-norm (the trainer's max_grad_norm) adds compute.CLIP_BYTES per gradient entry the optimizer
    holds to the update, at the fused AdamW's bandwidth fraction: on one GPU without ZeRO that is every
    parameter (the trace's count); plan, estimate (of a plan file too) and compare take it."""
    from cost_models.compute import CLIP_BYTES, memory_fraction
    from hardware_profiles import load_profile
    base = ("estimate", "tiny-llama", "--hardware", "h200", "--gpus", "1", "--global-batch", "4", "--seq-len", "64",
            "--micro-batch", "4", "--json")
    rc, plain, _ = run(capsys, *base)
    rc2, clipped, _ = run(capsys, *base, "--clip-grad-norm")
    assert rc == rc2 == 0
    rc3, traced, _ = run(capsys, "trace", "tiny-llama", "--seq-len", "64", "--json")
    params = json.loads(traced)["parameters"]
    profile = load_profile("h200")
    extra = CLIP_BYTES * params / (profile.memory_bandwidth * memory_fraction(profile, "adamw"))
    got = json.loads(clipped)["predicted"]["breakdown"]["optimizer_s"] - json.loads(plain)["predicted"]["breakdown"]["optimizer_s"]
    assert got == pytest.approx(extra, rel=1e-9)
    plan_file = tmp_path / "plan.yaml"
    cluster = ("--hardware", "h200", "--gpus", "1", "--global-batch", "4", "--seq-len", "64")
    rc, _, _ = run(capsys, "plan", "tiny-llama", *cluster, "--clip-grad-norm", "--output", str(plan_file), "--quiet")
    assert rc == 0
    rc, out, _ = run(capsys, "estimate", "tiny-llama", *cluster, "--plan", str(plan_file), "--clip-grad-norm", "--json")
    assert rc == 0 and json.loads(out)["predicted"]["breakdown"]["optimizer_s"] > 0
    rc, _, _ = run(capsys, "compare", "tiny-llama", "--hardware", "h200,h100-sxm", "--gpus", "1", "--global-batch", "4",
                   "--seq-len", "64", "--clip-grad-norm", "--quiet")
    assert rc == 0


def test_an_output_path_that_is_an_input_is_refused_before_planning(capsys, tmp_path):
    """`plan CONFIG --output CONFIG` replaced the model's config with the plan, and `calibrate --trainer --fit
    P --output P` the measured probes with a profile: one error line, the input untouched."""
    config = tmp_path / "config.json"
    text = json.dumps({"model_type": "llama", "vocab_size": 1000, "hidden_size": 256, "intermediate_size": 512,
                       "num_hidden_layers": 4, "num_attention_heads": 4})
    config.write_text(text)
    for model in (str(config), str(tmp_path)):  # the file, or the folder holding it
        rc, _, err = run(capsys, "plan", model, "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16",
                         "--seq-len", "256", "--output", str(config))
        assert rc == 2 and "is the input" in err and config.read_text() == text
    probes = tmp_path / "probes.jsonl"
    probes.write_text('{"probe": "x"}\n')
    rc, _, err = run(capsys, "calibrate", "--trainer", "--fit", str(probes), "--output", str(probes), "--base", "h200")
    assert rc == 2 and "is the input" in err and probes.read_text() == '{"probe": "x"}\n'


def test_explain_is_checked_before_any_output_and_joins_the_json(capsys, tmp_path):
    """`--explain bogus` failed after the plan was printed and its file written; with --json the explanation
    was text after the JSON document (stdout no longer parsed); `--explain ""` was ignored."""
    args = ("plan", "tiny-llama", "--hardware", "h100-sxm", "--gpus", "8", "--global-batch", "16", "--seq-len", "256",
            "--quiet")
    out_file = tmp_path / "plan.yaml"
    rc, out, err = run(capsys, *args, "--explain", "bogus", "--output", str(out_file))
    assert_one_line_error(rc, err, "--explain 'bogus'")
    assert out == "" and not out_file.exists()
    rc, _, err = run(capsys, *args, "--explain", "")
    assert_one_line_error(rc, err, "--explain")
    rc, out, _ = run(capsys, *args, "--json", "--explain", "layers.0.attn.q_proj")
    assert rc == 0 and json.loads(out)["explain"].startswith("layers.0.attn.q_proj")
