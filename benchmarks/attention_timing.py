"""Causal SDPA forward and backward times on the GPU, two ways, across shapes (device run).

    python benchmarks/attention_timing.py --out $OUT/attention.json
    python benchmarks/attention_timing.py --masked --out $OUT/attention_masked.json
    python benchmarks/attention_timing.py --backend flash --out $OUT/attention_flash.json
    python benchmarks/attention_timing.py --head-dims --out $OUT/attention_head_dims.json
    python benchmarks/attention_timing.py --head-dims --masked --out $OUT/attention_head_dims_masked.json
    python benchmarks/attention_timing.py --fit benchmarks/results/raw/attention_flash_h200_s60.json   # terms, CPU
    python benchmarks/attention_timing.py --fit-tiles benchmarks/results/raw/attention_head_dims_h200_s94.json \
        benchmarks/results/raw/attention_head_dims_masked_h200_s95.json --doc docs/attention_head_dims.md
        # the head-dim tiles' FLOP scales and each head dim's error, CPU

--masked: causal attention through an explicit additive mask instead of `is_causal`, as autoparallel's Hugging
Face forward passes one beyond a sliding window or with padding (autoparallel.hf.causal_mask: a [1, 1, S, S]
table broadcast over the batch; key/value heads repeated to the query's, as transformers' SDPA path does under
a mask). The kernel (cuDNN's or the memory-efficient one) cannot skip the masked half: the calibration's
attention_masked_{fwd,bwd}_terms (compute.attention_times) are fitted from these rows, on the shapes below
plus MASKED_EXTRA (head dims of 256: Gemma's).

For each (batch, heads, kv heads, seq, head dim): one call bracketed by device events (how `autoparallel
calibrate` timed attention until 2026-12-01: the host's dispatch of the call lands inside the window) and
the GPU's time alone (`calibrate._device_seconds`: graph replays, as in a step where the host runs ahead).
--backend flash: the causal kernel pinned to SDPA's flash backend (FlashAttention-2, vendored in torch), which torch
picked on Hopper until its bundled cuDNN crossed 9.15 (pytorch#138522 made cuDNN opt-in for 2.5.1, #162073 preferred
it again on sm90/sm100 from 2.9, gated on that cuDNN): what published torch-native runs of 2023-2025 ran. Fitted into
the calibration's attention_flash_{fwd,bwd}_terms (cost_models.estimate.RuntimeVariant.attention).

--head-dims: HEAD_DIM_SHAPES, five shapes at each of the head dimensions Hugging Face families use (64, 80: Phi-2,
CodeGen; 96: Phi-3; 128; 192; 256: Gemma), with the kernel torch picks and, at 80, 96 and 128, the flash backend:
whether a head dimension between the kernels' tile sizes costs the FLOPs of the tile it is padded to.

The shapes are the full calibration's (calibrate.ATTENTION_SHAPES: the sweep models' own, 1.3B llama 16/4
heads x 128, 350M GPT 16 x 64, 1.2B MoE 16/8 x 64, 7B llama 32/8 x 128, at several micro-batches, and short
and long sequences; the s17 run of 2026-12-01 also timed (4, 16, 16, 2048, 64) and (2, 32, 8, 4096, 128) twice).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


MASKED_EXTRA = ((4, 4, 1, 2048, 256), (8, 4, 1, 2048, 256), (2, 8, 4, 4096, 256), (1, 32, 8, 8192, 128),
                (2, 32, 8, 8192, 128))


HEAD_DIMS = (64, 80, 96, 128, 192, 256)
# Phi-2's (8, 32, 32, 2048, 80) and Phi-3-mini's (4, 32, 32, 4096, 96) trainer rows among them
HEAD_DIM_SHAPES = tuple((b, h, hkv, s, d) for d in HEAD_DIMS
                        for b, h, hkv, s in ((2, 32, 32, 2048), (8, 32, 32, 2048), (4, 32, 32, 4096),
                                             (2, 32, 8, 4096), (1, 16, 16, 8192)))
HEAD_DIM_FLASH = tuple(x for x in HEAD_DIM_SHAPES if x[4] in (80, 96, 128) and x[3] == 2048)


def time_shape(b: int, h: int, hkv: int, s: int, d: int, plan, masked: bool = False, backend: str = "default") -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from autoparallel.calibrate import _device_seconds, _sdpa_flops, time_call

    device = torch.device("cuda")
    q = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(b, hkv, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn(b, hkv, s, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    g = torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16)
    mask = None
    if masked:
        from autoparallel.hf import causal_mask

        mask = causal_mask(None, s, torch.bfloat16, device, "sdpa", batch=b, explicit=True)
        k = k.detach().repeat_interleave(h // hkv, dim=1).requires_grad_()
        v = v.detach().repeat_interleave(h // hkv, dim=1).requires_grad_()

    def fwd() -> torch.Tensor:
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        if backend == "flash":
            with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != hkv)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != hkv)

    def fwd_bwd() -> object:
        return torch.autograd.grad(fwd(), (q, k, v), g)

    ff, fb = _sdpa_flops((b, h, s, d), (b, hkv, s, d))
    return {"shape": [b, h, hkv, s, d], "masked": masked, "backend": backend, "fwd_flops": ff, "bwd_flops": fb,
            "kernels": _kernel_names(fwd_bwd) if backend == "default" else [],
            "event_fwd_s": time_call(lambda: fwd().detach(), device, plan.reps, plan.warmup),
            "event_fwd_bwd_s": time_call(fwd_bwd, device, plan.reps, plan.warmup),
            "device_fwd_s": _device_seconds(lambda: fwd().detach(), device, plan),
            "device_fwd_bwd_s": _device_seconds(fwd_bwd, device, plan)}


def _kernel_names(call) -> list[str]:
    """The GPU kernels one call of `call` launches, longest first (which library ran: cuDNN, flash, ...)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    call()
    torch.cuda.synchronize()
    if not hasattr(torch.autograd, "DeviceType"):
        return []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    spent: dict[str, float] = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            spent[e.name] = spent.get(e.name, 0.0) + e.device_time
    return [name[:160] for name, _ in sorted(spent.items(), key=lambda kv: -kv[1])[:4]]


def measure(out: Path, masked: bool = False, backend: str = "default", head_dims: bool = False) -> int:
    import torch

    from autoparallel.calibrate import ATTENTION_SHAPES, CalibrationPlan

    plan = CalibrationPlan.quick()
    rows = []
    extra = MASKED_EXTRA if masked else (MASKED_EXTRA[-2:] if backend == "flash" else ())  # + 8192-token rows
    todo = [(x, backend) for x in ATTENTION_SHAPES + extra]
    if head_dims:
        todo = [(x, "default") for x in HEAD_DIM_SHAPES] + [(x, "flash") for x in HEAD_DIM_FLASH]
        if masked:  # the masked kernel at the heads the causal kernels pad (64-128), up to 4096 tokens
            todo = [(x, "default") for x in HEAD_DIM_SHAPES if x[4] <= 128 and x[3] <= 4096]
    for (b, h, hkv, s, d), kind in todo:
        try:
            rec = time_shape(b, h, hkv, s, d, plan, masked, kind)
        except RuntimeError as e:  # one shape's failure must not lose the others
            rec = {"shape": [b, h, hkv, s, d], "error": str(e).splitlines()[0][:200]}
        torch.cuda.empty_cache()
        rows.append(rec)
        if "error" in rec:
            print(f"B{b} H{h}/{hkv} S{s} D{d}: {rec['error']}", flush=True)
            continue
        print(f"B{b} H{h}/{hkv} S{s} D{d} {kind}: fwd {1e3 * rec['event_fwd_s']:.3f} / "
              f"{1e3 * rec['device_fwd_s']:.3f} ms, "
              f"fwd+bwd {1e3 * rec['event_fwd_bwd_s']:.3f} / {1e3 * rec['device_fwd_bwd_s']:.3f} ms (event / device)",
              flush=True)
    out.write_text(json.dumps({"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows},
                              indent=1) + "\n")
    return 0


def fit(raw: Path, profile: str = "h200") -> dict:
    """calibrate.fit_attention_terms on a raw file's rows, timed as the GPU spends them (device_*), and each
    row's error under the fitted terms (compute.attention_times)."""
    from autoparallel.calibrate import fit_attention_terms, padded_samples
    from cost_models.compute import attention_times
    from hardware_profiles import load_profile

    prof = load_profile(profile)
    data = json.loads(raw.read_text())
    samples = padded_samples([_sample(r) for r in data["rows"] if "error" not in r], prof)
    out: dict = {"raw": str(raw), "device": data["device"], "torch": data["torch"], "rows": len(samples)}
    for phase in ("fwd", "bwd"):
        terms = fit_attention_terms(samples, phase, prof.peak("bf16"), prof.memory_bandwidth)
        cal = {**prof.calibration, f"attention_{phase}_terms": [round(x, 4) for x in terms]}
        fitted = dataclasses.replace(prof, calibration=cal)
        errs = []
        for x in samples:
            t = x.fwd_seconds if phase == "fwd" else x.bwd_seconds
            f = x.fwd_flops if phase == "fwd" else x.bwd_flops
            pred = attention_times(np.array([f]), phase, x.seq, x.head_dim, fitted, "bf16")[0]
            errs.append(pred / t - 1)
        out[phase] = {"terms": [round(x, 4) for x in terms], "mean_abs_error": float(np.mean(np.abs(errs))),
                      "max_abs_error": float(np.max(np.abs(errs)))}
    return out


def _sample(r: dict) -> Any:
    """A raw row as calibrate's AttentionSample, timed as the GPU spends it (the backward alone)."""
    from autoparallel.calibrate import AttentionSample

    return AttentionSample(*r["shape"], r["fwd_flops"], r["bwd_flops"], r["device_fwd_s"],
                           max(r["device_fwd_bwd_s"] - r["device_fwd_s"], 1e-9), r.get("backend", "default"),
                           bool(r.get("masked")))


def _samples(raws: list[Path], backend: str, masked: bool = False) -> list:
    return [_sample(r) for raw in raws for r in json.loads(raw.read_text())["rows"]
            if "error" not in r and r.get("backend", "default") == backend and bool(r.get("masked")) == masked]


def fit_tiles(raws: list[Path], doc: Path | None, profile: str = "h200") -> str:
    """calibrate.fit_attention_tile_scale on --head-dims files' causal default-kernel rows, and each head dim's
    mean error (forward / backward) under the profile as shipped, without the head-dim tiles (the terms at the
    head dim as traced), and with the fitted scales; both causal kernels and the masked one (--masked rows)."""
    from autoparallel.calibrate import fit_attention_tile_scale
    from cost_models.compute import attention_times
    from hardware_profiles import load_profile

    prof = load_profile(profile)
    tile_keys = ("attention_head_dim_tile", "attention_flash_head_dim_tile", "attention_tile_flop_scale")
    bare = dataclasses.replace(prof, calibration={k: v for k, v in prof.calibration.items() if k not in tile_keys})
    scales = fit_attention_tile_scale(_samples(raws, "default"), prof)
    fitted = dataclasses.replace(prof, calibration={**prof.calibration, "attention_tile_flop_scale": scales})
    lines = [f"`calibrate.fit_attention_tile_scale`: attention_tile_flop_scale {json.dumps(scales)}", "",
             "| kernel | head dim | shapes | no tiles fwd / bwd | padded, fitted scales fwd / bwd |",
             "|---|---:|---:|---:|---:|"]
    for backend, masked in (("default", False), ("flash", False), ("default", True)):
        by_dim: dict[int, list] = {}
        for x in _samples(raws, backend, masked):
            by_dim.setdefault(x.head_dim, []).append(x)
        for d, xs in sorted(by_dim.items()):
            cells = []
            for p in (bare, fitted):
                err = {ph: np.mean([attention_times(np.array([x.fwd_flops if ph == "fwd" else x.bwd_flops]), ph,
                                                    x.seq, x.head_dim, p, "bf16", np.array([masked]), backend)[0]
                                    / (x.fwd_seconds if ph == "fwd" else x.bwd_seconds) - 1 for x in xs])
                       for ph in ("fwd", "bwd")}
                cells.append(f"{100 * err['fwd']:+.1f}% / {100 * err['bwd']:+.1f}%")
            lines.append(f"| {'masked' if masked else backend} | {d} | {len(xs)} | {cells[0]} | {cells[1]} |")
    table = "\n".join(lines)
    if doc is not None:
        cmd = f"python benchmarks/attention_timing.py --fit-tiles {' '.join(map(str, raws))} --doc {doc}"
        doc.write_text(f"# Attention across head dimensions (H200)\n\nCommand: `{cmd}`\n\n{DOC_INTRO}\n\n{table}\n")
    return table


DOC_INTRO = """Causal SDPA timed as the GPU spends it (graph replays) at five shapes for each head dimension a Hugging
Face family uses (`--head-dims`: 64; 80, Phi-2's and CodeGen's; 96, Phi-3's; 128; 192; 256, Gemma's), the
kernel torch 2.11 picks on an H200 (cuDNN's sm90 flash kernels: the raw file lists each shape's kernels) and,
at 80-128, SDPA's flash backend (FlashAttention-2); `--head-dims --masked` the kernel given an additive mask at
64-128 (the same cuDNN kernels, s95). The kernels' names carry their head-dim tile: cuDNN ran
heads of 80 and 96 in the 128-wide kernels (`..._64x128x128_...`), within 8% of 128's time, where the FLOPs
say 0.63 and 0.75 of it; FlashAttention-2 ran 80 as 96 (its templates every 32). The profile's
`attention_head_dim_tile` (64) and `attention_flash_head_dim_tile` (32) price a head at the width its kernel
computes (`cost_models.compute.padded_head_dim`), and `attention_tile_flop_scale` the 192- and 256-wide
kernels' lower FLOP rate, which the causal terms (fitted at 64 and 128) cannot see. Errors are the mean
signed error of the model against the measured times, forward / backward; at 192 and 256 the scales were
fitted on these rows (in sample), at 80 and 96 nothing was: the padding alone."""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=None, help="measure on this machine's GPU, write JSON here")
    ap.add_argument("--masked", action="store_true", help="causal attention through an explicit additive mask")
    ap.add_argument("--backend", choices=("default", "flash"), default="default",
                    help="the kernel torch picks, or SDPA's flash backend (FlashAttention-2) pinned")
    ap.add_argument("--head-dims", action="store_true",
                    help="HEAD_DIM_SHAPES: five shapes at each of head dims 64-256 (and the flash backend at 80-128)")
    ap.add_argument("--fit", type=Path, default=None, help="fit the four terms to a raw file's rows (no GPU)")
    ap.add_argument("--fit-tiles", type=Path, nargs="+", default=None,
                    help="fit the head-dim tiles' FLOP scales to --head-dims raw files (no GPU)")
    ap.add_argument("--doc", type=Path, default=None, help="with --fit-tiles: write the table here")
    args = ap.parse_args()
    if args.fit_tiles is not None:
        print(fit_tiles(args.fit_tiles, args.doc))
        return 0
    if args.fit is not None:
        print(json.dumps(fit(args.fit), indent=1))
        return 0
    if args.out is None:
        ap.error("give --out")
    if args.masked and args.backend != "default":
        ap.error("--masked times the kernel torch picks for a mask; drop --backend")
    if args.head_dims and args.backend != "default":
        ap.error("--head-dims picks its own kernels; drop --backend")
    return measure(args.out, args.masked, args.backend, args.head_dims)


if __name__ == "__main__":
    np.seterr(all="ignore")
    sys.exit(main())
