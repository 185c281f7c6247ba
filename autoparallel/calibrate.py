"""`autoparallel calibrate`: measure the local accelerator and fit a hardware profile's efficiencies.

What is measured (each timed with device events after warm-up, median of repeats, random inputs):

  GEMMs         C = A @ B across shapes (square and transformer-like, forward and weight-gradient
                layouts) and dtypes (bf16, fp16, tf32, fp32); inputs rotate over several buffers so small
                GEMMs are not timed out of the L2 cache
  bandwidth     copy, add, scale, SiLU and a bf16 -> fp32 cast over 1 MiB .. 1 GiB tensors
  launch        per-kernel cost of tiny kernels replayed from a CUDA graph (what the GPU pays between
                back-to-back kernels) and the eager dispatch cost of one tiny op (what the host pays)
  FP8 GEMMs     torch._scaled_mm of float8_e4m3fn operands (tensorwise scales, bf16 out), the GEMM
                torchao's float8 linears run; CUDA devices of compute capability >= 8.9 whose profile
                has an fp8 peak (the casts around it are priced from bytes, not measured here)
  grouped GEMMs torch._grouped_mm as the MoE experts call it (bf16, balanced groups): the forward /
                input-gradient layout [G*m, k] x [G, k, n] and the weight-gradient layout
                [k, G*m] x [G*m, n] -> [G, k, n]
  attention     F.scaled_dot_product_attention (causal) forward and backward with the backend torch picks
                by default (cuDNN on Hopper with torch >= 2.5, else flash): the kernel the trainer runs
  collectives   all-reduce, all-gather, reduce-scatter, all-to-all and paired send/recv over the default
                process group (1 MiB - 1 GiB), only when
                torch.distributed is initialized with world size > 1 (run under torchrun)

What is fitted, with the cost model's own formulas (cost_models/compute.py, cost_models/comm.py):

  memory_bound       achieved / datasheet bandwidth of the large bandwidth-bound kernels (median)
  kernel_overhead_us per-kernel GPU cost from graph replay
  gemm_max, gemm_half_flops
                     minimize sum_i log^2(t_model_i / t_measured_i) over the bf16 GEMMs, where
                     t_model = max(F / (P * e(F)), bytes / (BW * memory_bound)) + kernel_overhead and
                     e(F) = gemm_max * F / (F + gemm_half_flops)   (so t_compute = (F + F_half) / (P gemm_max):
                     a fixed per-GEMM cost plus a rate); grid search, then a finer grid around the best
  gemm_fp8_max       the same curve's maximum for the FP8 GEMMs against the fp8 peak, with the half size
                     fixed at gemm_half_flops * P_fp8 / P_bf16 (compute.fp8_gemm_curve's default)
  gemm_grouped_max, gemm_grouped_half_flops
                     the same curve for the grouped GEMMs on one group's FLOPs, bytes and time (F/G,
                     bytes/G, t/G), which is the cost model's t = (F + G F_half) / (P max)
  attention_fwd_terms / attention_bwd_terms
                     compute.attention_times' four terms (flop_max, score_ps, row_bytes, fixed_us): least
                     squares in relative error over the timed shapes (`fit_attention_terms`; at least 8
                     shapes, as the full plan's 26), on the FLOPs torch.utils.flop_counter (and so the
                     tracer) counts, causal attention as if it were full, so flop_max may exceed 1. With
                     fewer shapes (the quick plan) the GEMM-like curve attention_fwd_max / _half_flops.
  attention_masked_fwd_terms / attention_masked_bwd_terms
                     the same four terms for the same shapes given an additive causal mask (what the
                     Hugging Face forward passes beyond a sliding window or with padding): the kernels
                     compute every score (cuDNN's on an H200: 2.9-3.1x the causal time)
                     Timed as the GPU spends it (`_device_seconds`: graph replays), as a step whose host
                     runs ahead sees it; kept under `calibration`
  collective_intra | collective_inter and the link latency
                     least squares of t = f(n) S / (B e) + k(n) a over the collective samples
                     (f, k per comm.py: all-reduce 2(n-1)/n and 2(n-1), the others (n-1)/n and n-1)

The result is the base profile with these efficiencies, a `calibration` section (device, date, torch
version, the fitted values and their fit errors) and a raw-measurement JSON file next to the YAML.
"""

from __future__ import annotations

import datetime
import itertools
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from autoparallel.errors import UserError
from autoparallel.limits import load_document
from cost_models.comm import COLLECTIVES, collective_terms
from cost_models.compute import ATTENTION_TERMS, attention_times, padded_head_dim

Say = Callable[[str], None]
# Causal attention's counted FLOPs (flop_counter counts the masked half too) can be done at up to twice the
# peak rate by a kernel that skips masked tiles (cuDNN on an H200 reached 1.18x): the fit's upper bound.
CAUSAL_MAX_FRACTION = 2.0

# Transformer-like GEMMs: (tokens M, out N, in K). Hidden sizes of 768..4096, MLP widths, vocabularies
# (50257 is GPT-2's odd vocabulary, which cuBLAS tiles less well).
_NK = [(768, 768), (3072, 768), (768, 3072), (2048, 2048), (6144, 2048), (8192, 2048), (2048, 8192),
       (4096, 4096), (11008, 4096), (4096, 11008), (14336, 4096), (32000, 2048), (50257, 768)]


# (B, H, Hkv, S, D) of the full calibration's attention: batch 1-32, sequences 512-16384, head dims 64 and
# 128, grouped and not (the four-term fit needs shapes that tell FLOPs, scores and rows apart)
ATTENTION_SHAPES = ((8, 12, 12, 1024, 64), (4, 16, 16, 2048, 64), (4, 16, 16, 2048, 128), (2, 32, 8, 4096, 128),
                    (1, 32, 32, 8192, 128), (2, 16, 4, 8192, 128),
                    (1, 16, 4, 2048, 128), (2, 16, 4, 2048, 128), (4, 16, 4, 2048, 128), (8, 16, 4, 2048, 128),
                    (16, 16, 4, 2048, 128), (2, 16, 16, 2048, 64), (8, 16, 16, 2048, 64), (16, 16, 16, 2048, 64),
                    (2, 16, 8, 2048, 64), (4, 16, 8, 2048, 64), (8, 16, 8, 2048, 64), (16, 16, 8, 2048, 64),
                    (1, 32, 8, 4096, 128), (4, 32, 8, 4096, 128), (32, 16, 16, 512, 64), (16, 16, 16, 1024, 128),
                    (8, 32, 8, 1024, 128), (1, 32, 8, 8192, 128), (1, 16, 4, 16384, 128), (1, 32, 8, 16384, 128))


@dataclass(frozen=True)
class CalibrationPlan:
    """What to measure; `full()` for a profile, `quick()` for a smoke run, tests use tiny ones."""
    gemm_shapes: tuple[tuple[int, int, int], ...]          # (M, N, K) of A[M,K] @ B[K,N], bf16
    gemm_wgrad_shapes: tuple[tuple[int, int, int], ...]    # (M, N, K) computed as A[K,M]^T @ B[K,N]
    other_dtype_shapes: tuple[tuple[int, int, int], ...]   # also timed in fp16, tf32, fp32
    bandwidth_bytes: tuple[int, ...]                       # bytes of each operand tensor
    attention_shapes: tuple[tuple[int, int, int, int, int], ...]  # (B, H, Hkv, S, D)
    collective_bytes: tuple[int, ...]
    reps: int = 10
    warmup: int = 3
    large_bandwidth_bytes: int = 64 * 2**20   # operands at least this large define memory_bound
    class_bytes: int = 256 * 2**20            # main-tensor bytes of each kernel-family measurement
    host_inner: int = 20                      # tiny-model steps per timed repeat of the host measurement
    grouped_gemm_shapes: tuple[tuple[int, int, int, int], ...] = ()  # (groups, rows per group, N, K)
    fp8_gemm_shapes: tuple[tuple[int, int, int], ...] = ()  # (M, N, K) of torch._scaled_mm in float8

    @classmethod
    def full(cls) -> CalibrationPlan:
        squares = tuple((n, n, n) for n in (256, 512, 1024, 2048, 4096, 6144, 8192))
        rows = tuple((m, n, k) for m in (2048, 8192, 32768) for n, k in _NK)
        return cls(
            gemm_shapes=squares + rows,
            gemm_wgrad_shapes=((768, 3072, 8192), (2048, 8192, 16384), (4096, 4096, 16384),
                               (4096, 11008, 8192)),
            other_dtype_shapes=((4096, 4096, 4096), (8192, 2048, 8192)),
            bandwidth_bytes=tuple(2**20 * m for m in (1, 4, 16, 64, 256, 1024)),
            attention_shapes=ATTENTION_SHAPES,
            collective_bytes=tuple(2**20 * m for m in (1, 8, 64, 256, 1024)),
            # expert shapes: 8 x (1024 -> 2816) as the benchmark MoE, mixtral's 8 x (4096 -> 14336),
            # qwen3-30b-a3b's 128 x (2048 -> 768); both projection directions
            grouped_gemm_shapes=((8, 4096, 2816, 1024), (8, 4096, 1024, 2816), (8, 2048, 2816, 1024),
                                 (8, 8192, 14336, 4096), (8, 8192, 4096, 14336), (128, 256, 768, 2048),
                                 (128, 256, 2048, 768), (128, 1024, 768, 2048)),
            fp8_gemm_shapes=tuple((n, n, n) for n in (1024, 2048, 4096, 8192))
            + ((16384, 2048, 2048), (16384, 5632, 2048), (16384, 2048, 5632), (16384, 4096, 4096),
               (16384, 14336, 4096), (16384, 4096, 14336)),
            large_bandwidth_bytes=256 * 2**20)

    @classmethod
    def quick(cls) -> CalibrationPlan:
        return cls(
            gemm_shapes=((1024, 1024, 1024), (4096, 4096, 4096), (8192, 8192, 8192), (2048, 768, 768),
                         (8192, 8192, 2048), (8192, 2048, 8192), (32768, 4096, 4096)),
            gemm_wgrad_shapes=((2048, 8192, 16384),),
            other_dtype_shapes=((4096, 4096, 4096),),
            bandwidth_bytes=(2**20, 16 * 2**20, 256 * 2**20),
            attention_shapes=((4, 16, 16, 2048, 128),),
            collective_bytes=(2**20, 64 * 2**20),
            fp8_gemm_shapes=((4096, 4096, 4096), (16384, 4096, 4096)),
            reps=5, warmup=2)


# ---- samples ------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GemmSample:
    m: int
    n: int
    k: int
    dtype: str          # bf16 | fp16 | tf32 | fp32
    layout: str         # "nn" (A @ B) or "tn" (A^T @ B, the weight-gradient layout)
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        if self.dtype == "fp8":  # float8 operands, bf16 output
            return float(self.m * self.k + self.k * self.n + 2 * self.m * self.n)
        size = {"bf16": 2, "fp16": 2}.get(self.dtype, 4)
        return float(size * (self.m * self.k + self.k * self.n + self.m * self.n))


@dataclass(frozen=True)
class GroupedGemmSample:
    groups: int
    m: int              # rows per group (balanced routing)
    n: int
    k: int
    layout: str         # "fwd": [G*m, k] x [G, k, n] -> [G*m, n]; "wgrad": [k, G*m] x [G*m, n] -> [G, k, n]
    seconds: float

    @property
    def flops(self) -> float:
        return 2.0 * self.groups * self.m * self.n * self.k

    @property
    def bytes(self) -> float:
        g, m, n, k = self.groups, self.m, self.n, self.k
        return 2.0 * (g * m * k + g * k * n + g * m * n)  # bf16; the same three tensors in both layouts


@dataclass(frozen=True)
class BandwidthSample:
    op: str             # copy | add | scale | silu | cast
    bytes: float        # bytes read + written
    seconds: float


@dataclass(frozen=True)
class AttentionSample:
    batch: int
    heads: int
    kv_heads: int
    seq: int
    head_dim: int
    fwd_flops: float    # as torch.utils.flop_counter counts them (causal counted as full)
    bwd_flops: float
    fwd_seconds: float
    bwd_seconds: float  # backward alone: (forward + backward) - forward
    backend: str
    masked: bool = False  # causal through an additive mask (autoparallel.hf.causal_mask), not is_causal


@dataclass(frozen=True)
class CollectiveSample:
    op: str             # all_reduce | all_gather | reduce_scatter | all_to_all | send_recv
    bytes: float        # the full tensor (comm.py's S)
    world: int
    seconds: float


@dataclass
class Measurements:
    device: str
    device_name: str
    torch_version: str
    date: str
    gemm: list[GemmSample] = field(default_factory=list)
    grouped_gemm: list[GroupedGemmSample] = field(default_factory=list)
    bandwidth: list[BandwidthSample] = field(default_factory=list)
    launch_graph_s: float = 0.0     # per tiny kernel, replayed from a graph (0: not measured)
    launch_eager_s: float = 0.0     # per tiny eager op (host dispatch bound)
    attention: list[AttentionSample] = field(default_factory=list)
    collectives: list[CollectiveSample] = field(default_factory=list)
    collective_span: str = "intra"  # intra: all ranks on one node
    kernel_classes: dict[str, float] = field(default_factory=dict)  # family -> bytes/s (tracer bytes)
    host_fwd_s: float = 0.0         # host seconds per forward / backward op of an eager training step
    host_bwd_s: float = 0.0
    host_moe_fwd_s: float = 0.0     # the same for a mixture-of-experts model
    host_moe_bwd_s: float = 0.0
    host_gemm_new_shape_s: float = 0.0   # host seconds per GEMM call of a never-seen / a repeated shape
    host_gemm_seen_shape_s: float = 0.0
    large_bandwidth_bytes: int = 0       # the plan's threshold for memory_bound (so a refit agrees)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Measurements:
        kinds = {"gemm": GemmSample, "grouped_gemm": GroupedGemmSample, "bandwidth": BandwidthSample, "attention": AttentionSample,
                 "collectives": CollectiveSample}
        kw = {k: v for k, v in d.items() if k not in kinds}
        m = cls(**kw)
        for key, kind in kinds.items():
            setattr(m, key, [kind(**x) for x in d.get(key, [])])
        return m


# ---- timing ---------------------------------------------------------------------------------------------
def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu" and hasattr(torch, "accelerator"):
        torch.accelerator.synchronize()


def time_call(fn: Callable[[], object], device: torch.device, reps: int = 10, warmup: int = 3,
              inner: int = 1) -> float:
    """Median seconds of one call of `fn` (each repeat times `inner` back-to-back calls).

    Device events bracket each repeat on an accelerator (work is asynchronous); the host clock after a
    synchronize on the CPU."""
    for _ in range(warmup):
        fn()
    _synchronize(device)
    times = []
    if device.type == "cuda":
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3 / inner)
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            _synchronize(device)
            times.append((time.perf_counter() - t0) / inner)
    return statistics.median(times)


def time_on_device(fn: Callable[[], object], device: torch.device, reps: int = 10, warmup: int = 3) -> float:
    """Median device seconds of one call of `fn`, free of host launch cost: on CUDA the calls are
    captured into a graph of `inner` back-to-back calls (enough for about a millisecond) and the graph
    is replayed; elsewhere `time_call`. This is what the GPU spends when the host runs ahead of it."""
    if device.type != "cuda":
        return time_call(fn, device, reps, warmup)
    estimate = time_call(fn, device, reps=3, warmup=warmup)
    inner = int(min(64, max(1, round(1e-3 / max(estimate, 1e-7)))))
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(2):  # warm-up on a side stream, as graph capture wants
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(inner):
            fn()
    return time_call(graph.replay, device, reps, warmup=1) / inner


_TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "tf32": torch.float32, "fp32": torch.float32}


def _buffers_for(nbytes: float, l2_bytes: int) -> int:
    """Input sets to rotate over so that the working set is >= 4x the L2 cache (at most 8)."""
    return int(min(8, max(1, math.ceil(4 * l2_bytes / max(nbytes, 1)))))


def measure_gemms(device: torch.device, plan: CalibrationPlan, say: Say, l2_bytes: int) -> list[GemmSample]:
    out: list[GemmSample] = []
    jobs = [(s, "bf16", "nn") for s in plan.gemm_shapes]
    jobs += [(s, "bf16", "tn") for s in plan.gemm_wgrad_shapes]
    jobs += [(s, dt, "nn") for dt in ("fp16", "tf32", "fp32") for s in plan.other_dtype_shapes]
    allow_tf32 = torch.backends.cuda.matmul.allow_tf32
    try:
        for i, ((m, n, k), dt, layout) in enumerate(jobs):
            dtype = _TORCH_DTYPES[dt]
            if device.type == "cuda":
                torch.backends.cuda.matmul.allow_tf32 = dt == "tf32"
            per_set = (m * k + k * n + m * n) * torch.finfo(dtype).bits // 8
            sets = []
            for _ in range(_buffers_for(per_set, l2_bytes)):
                a = torch.randn((k, m) if layout == "tn" else (m, k), device=device, dtype=dtype)
                b = torch.randn(k, n, device=device, dtype=dtype)
                sets.append((a.t() if layout == "tn" else a, b, torch.empty(m, n, device=device, dtype=dtype)))
            it = itertools.count()

            def call(sets=sets, it=it) -> None:
                a, b, c = sets[next(it) % len(sets)]
                torch.mm(a, b, out=c)

            t = time_on_device(call, device, plan.reps, plan.warmup)
            sample = GemmSample(m, n, k, dt, layout, t)
            out.append(sample)
            say(f"gemm {i + 1}/{len(jobs)} {dt} {layout} {m}x{n}x{k}: {sample.flops / t / 1e12:.1f} TFLOP/s")
            del sets
    finally:
        torch.backends.cuda.matmul.allow_tf32 = allow_tf32
    return out


def fp8_gemm_supported(device: torch.device) -> bool:
    """torch._scaled_mm in float8 runs on CUDA devices of compute capability >= 8.9 (Ada, Hopper, ...)."""
    return (device.type == "cuda" and hasattr(torch, "float8_e4m3fn")
            and torch.cuda.get_device_capability(device) >= (8, 9))


def measure_fp8_gemms(device: torch.device, plan: CalibrationPlan, say: Say, l2_bytes: int) -> list[GemmSample]:
    """FP8 GEMMs as torchao's float8 linears call them: e4m3 A [M, K] row-major, B [K, N] column-major,
    tensorwise fp32 scales, bf16 output (dtype "fp8" samples); none where fp8_gemm_supported is false."""
    if not plan.fp8_gemm_shapes or not fp8_gemm_supported(device):
        return []
    out: list[GemmSample] = []
    one = torch.ones((), device=device, dtype=torch.float32)
    for i, (m, n, k) in enumerate(plan.fp8_gemm_shapes):
        sets = []
        for _ in range(_buffers_for(m * k + k * n + 2 * m * n, l2_bytes)):
            a = torch.randn(m, k, device=device).to(torch.float8_e4m3fn)
            b = torch.randn(n, k, device=device).to(torch.float8_e4m3fn).t()  # column-major, as cuBLASLt wants
            sets.append((a, b))
        it = itertools.count()

        def call(sets=sets, it=it) -> torch.Tensor:
            a, b = sets[next(it) % len(sets)]
            return torch._scaled_mm(a, b, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)

        t = time_on_device(call, device, plan.reps, plan.warmup)
        sample = GemmSample(m, n, k, "fp8", "nn", t)
        out.append(sample)
        say(f"fp8 gemm {i + 1}/{len(plan.fp8_gemm_shapes)} {m}x{n}x{k}: {sample.flops / t / 1e12:.1f} TFLOP/s")
        del sets
    return out


def measure_grouped_gemms(device: torch.device, plan: CalibrationPlan, say: Say) -> list[GroupedGemmSample]:
    """torch._grouped_mm in bf16 with balanced groups, in the layouts GroupedExperts' forward and backward
    run (the weight is the transposed view of a stacked [G, n, k] parameter, as in the model)."""
    out: list[GroupedGemmSample] = []
    jobs = [(s, layout) for s in plan.grouped_gemm_shapes for layout in ("fwd", "wgrad")]
    bf16 = torch.bfloat16
    for i, ((g, m, n, k), layout) in enumerate(jobs):
        offs = torch.arange(1, g + 1, device=device, dtype=torch.int32) * m
        if layout == "fwd":
            a = torch.randn(g * m, k, device=device, dtype=bf16)
            b = torch.randn(g, n, k, device=device, dtype=bf16).transpose(-2, -1)
        else:
            a = torch.randn(g * m, k, device=device, dtype=bf16).t()
            b = torch.randn(g * m, n, device=device, dtype=bf16)

        def call(a=a, b=b, offs=offs) -> torch.Tensor:
            return torch._grouped_mm(a, b, offs=offs)

        sample = GroupedGemmSample(g, m, n, k, layout, time_on_device(call, device, plan.reps, plan.warmup))
        out.append(sample)
        say(f"grouped gemm {i + 1}/{len(jobs)} {layout} {g}x({m}x{n}x{k}): "
            f"{sample.flops / sample.seconds / 1e12:.1f} TFLOP/s")
        del a, b
    return out


def _bandwidth_ops(n: int, device: torch.device) -> dict[str, tuple[Callable[[], object], float]]:
    """Bandwidth-bound kernels over n bf16 elements: name -> (call, bytes read + written)."""
    x = torch.randn(n, device=device, dtype=torch.bfloat16)
    y = torch.randn(n, device=device, dtype=torch.bfloat16)
    z = torch.empty_like(x)
    f = torch.empty(n, device=device, dtype=torch.float32)
    return {
        "copy": (lambda: z.copy_(x), 2 * 2 * n),
        "add": (lambda: torch.add(x, y, out=z), 3 * 2 * n),
        "scale": (lambda: torch.mul(x, 1.5, out=z), 2 * 2 * n),
        "silu": (lambda: torch.nn.functional.silu(x), 2 * 2 * n),
        "cast": (lambda: f.copy_(x), (2 + 4) * n),
    }


def measure_bandwidth(device: torch.device, plan: CalibrationPlan, say: Say) -> list[BandwidthSample]:
    out: list[BandwidthSample] = []
    for nbytes in plan.bandwidth_bytes:
        ops = _bandwidth_ops(max(1, nbytes // 2), device)
        inner = max(1, min(50, plan.large_bandwidth_bytes // max(nbytes, 1)))
        row = [BandwidthSample(op, float(moved), time_call(fn, device, plan.reps, plan.warmup, inner=inner))
               for op, (fn, moved) in ops.items()]
        out += row
        best = max(s.bytes / s.seconds for s in row)
        say(f"bandwidth {nbytes / 2**20:.3g} MiB operands: up to {best / 1e9:.0f} GB/s")
        del ops
    return out


def measure_launch(device: torch.device, say: Say) -> tuple[float, float]:
    """(per-kernel seconds replayed from a CUDA graph, per-op eager seconds); graph 0.0 off CUDA."""
    x = torch.zeros(1, device=device)
    n = 200

    def burst() -> None:
        for _ in range(n):
            x.add_(1.0)

    eager = time_call(burst, device, reps=5, warmup=2) / n
    graph_s = 0.0
    if device.type == "cuda":
        stream = torch.cuda.Stream(device)
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.cuda.stream(stream):
            burst()  # warm-up on a side stream, as graph capture wants
        torch.cuda.current_stream(device).wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            burst()
        graph_s = time_call(graph.replay, device, reps=10, warmup=2) / n
        say(f"launch: {graph_s * 1e6:.2f} us per kernel in a graph, {eager * 1e6:.2f} us per eager op")
    else:
        say(f"launch: {eager * 1e6:.2f} us per eager op (no graphs off CUDA)")
    return graph_s, eager


def _sdpa_flops(q: tuple[int, ...], k: tuple[int, ...]) -> tuple[float, float]:
    """(forward, backward) FLOPs of attention as torch.utils.flop_counter counts them (and so the tracer):
    forward q k^T and p v, 2 * 2 B H S_q S_k D; backward recomputes the scores and runs four more such
    products, 2.5x forward. Causal masking is not discounted. Written out here because older torch
    releases' formulas reject grouped-query shapes."""
    b, h, s_q, d = q
    s_k = k[2]
    fwd = 2 * (2.0 * b * h * s_q * s_k * d)
    return fwd, 2.5 * fwd


def _attention_times(b: int, h: int, hkv: int, s: int, d: int, device: torch.device,
                     plan: CalibrationPlan, masked: bool = False) -> tuple[float, float]:
    """(forward, forward + backward) seconds of causal SDPA on random bf16 inputs; `masked`: causal through the
    additive mask the Hugging Face forward builds, key/value heads repeated to the query's (as transformers'
    SDPA path does under a mask)."""
    import torch.nn.functional as F

    from autoparallel.hf import causal_mask

    dtype = torch.bfloat16 if device.type != "cpu" else torch.float32
    kv = h if masked else hkv
    q = torch.randn(b, h, s, d, device=device, dtype=dtype, requires_grad=True)
    k = torch.randn(b, kv, s, d, device=device, dtype=dtype, requires_grad=True)
    v = torch.randn(b, kv, s, d, device=device, dtype=dtype, requires_grad=True)
    g = torch.randn(b, h, s, d, device=device, dtype=dtype)
    mask = causal_mask(None, s, dtype, device, "sdpa", batch=b, explicit=True) if masked else None

    def fwd() -> torch.Tensor:
        if mask is not None:
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=h != hkv)

    # The GPU's time, as in a training step where the host runs ahead: one call bracketed by events also
    # times the host's dispatch of it (SDPA's Python and the autograd engine, tens of microseconds), which
    # inflated the small shapes and so the curve's half-size (docs/trainer_sweep_notes.md, attention).
    return (_device_seconds(lambda: fwd().detach(), device, plan),
            _device_seconds(lambda: torch.autograd.grad(fwd(), (q, k, v), g), device, plan))


def _device_seconds(fn: Callable[[], object], device: torch.device, plan: CalibrationPlan) -> float:
    """`time_on_device` (graph replays); where the call cannot be captured, back-to-back calls filling
    about 2 ms per repeat, which hide the host's dispatch whenever the kernels outlast it."""
    try:
        return time_on_device(fn, device, plan.reps, plan.warmup)
    except RuntimeError:
        one = time_call(fn, device, reps=3, warmup=plan.warmup)
        inner = int(min(64, max(1, round(2e-3 / max(one, 1e-7)))))
        return time_call(fn, device, plan.reps, 1, inner=inner)


def measure_attention(device: torch.device, plan: CalibrationPlan, say: Say) -> list[AttentionSample]:
    from contextlib import nullcontext

    from torch.nn.attention import SDPBackend, sdpa_kernel

    out: list[AttentionSample] = []
    # On CUDA the default dispatch: the trainer's models call SDPA without pinning a backend, so the
    # kernel torch picks there is the one to price (cuDNN on an H200 with torch 2.11 ran the trainer's
    # attention at 0.56x the flash kernel's time).
    backend_name = "default" if device.type == "cuda" else "math"
    for masked in (False, True):
        for b, h, hkv, s, d in plan.attention_shapes:
            what = f"attention{' masked' if masked else ''} B{b} H{h}/{hkv} S{s} D{d}"
            try:
                with nullcontext() if device.type == "cuda" else sdpa_kernel([SDPBackend.MATH]):
                    t_f, t_fb = _attention_times(b, h, hkv, s, d, device, plan, masked)
            except RuntimeError as e:  # no such kernel for this shape / device: skip it, say why
                say(f"{what}: skipped ({str(e).splitlines()[0][:80]})")
                continue
            ff, fb = _sdpa_flops((b, h, s, d), (b, hkv, s, d))
            sample = AttentionSample(b, h, hkv, s, d, ff, fb, t_f, max(t_fb - t_f, 1e-9), backend_name, masked)
            out.append(sample)
            say(f"{what}: fwd {ff / t_f / 1e12:.0f}, bwd {fb / sample.bwd_seconds / 1e12:.0f} TFLOP/s "
                f"(flop_counter FLOPs)")
    return out


def measure_collectives(device: torch.device, plan: CalibrationPlan, say: Say) -> tuple[list[CollectiveSample], str]:
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        say("collectives: skipped (torch.distributed is not initialized with world size > 1; run under "
            "torchrun to measure them)")
        return [], "intra"
    n = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", n))
    span = "intra" if local >= n else "inter"
    out: list[CollectiveSample] = []
    for nbytes in plan.collective_bytes:
        numel = max(n, (nbytes // 2) // n * n)
        for op, fn in _collective_ops(numel, n, device).items():
            t = _max_over_ranks(time_call(fn, device, plan.reps, plan.warmup), device)
            out.append(CollectiveSample(op, float(numel * 2), n, t))
        say(f"collectives {numel * 2 / 2**20:.0f} MiB over {n} ranks: "
            + ", ".join(f"{s.op} {s.seconds * 1e3:.3f} ms" for s in out[-len(COLLECTIVES):]))
    return out, span


def _collective_ops(numel: int, n: int, device: torch.device) -> dict[str, Callable[[], object]]:
    import torch.distributed as dist

    full = torch.randn(numel, device=device, dtype=torch.bfloat16)
    shard = torch.empty(numel // n, device=device, dtype=torch.bfloat16)
    received = torch.empty_like(full)
    rank = dist.get_rank()

    def send_recv() -> None:  # ranks pair up (0<->1, 2<->3, ...), as pipeline stages exchange activations
        peer = rank ^ 1
        if peer >= n:
            return
        ops = [dist.P2POp(dist.isend, full, peer), dist.P2POp(dist.irecv, received, peer)]
        for work in dist.batch_isend_irecv(ops if rank % 2 == 0 else ops[::-1]):
            work.wait()

    return {"all_reduce": lambda: dist.all_reduce(full),
            "all_gather": lambda: dist.all_gather_into_tensor(full, shard),
            "reduce_scatter": lambda: dist.reduce_scatter_tensor(shard, full),
            "all_to_all": lambda: dist.all_to_all_single(received, full),
            "send_recv": send_recv}


def _max_over_ranks(t: float, device: torch.device) -> float:
    import torch.distributed as dist
    x = torch.tensor([t], device=device, dtype=torch.float64)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    return float(x.item())


# Kernel families the cost model gives their own bandwidth fraction (cost_models.compute.CLASSES), and
# the bytes the tracer counts for each (inputs read + outputs written, per element of the main tensor):
# name -> (build(n_rows, width, device) -> call, bytes).
def _class_kernels(rows: int, device: torch.device) -> dict[str, tuple[Callable[[], object], float]]:
    import torch.nn.functional as F

    bf, f32 = torch.bfloat16, torch.float32
    h, s_attn, vocab = 2048, 2048, 32768
    out: dict[str, tuple[Callable[[], object], float]] = {}

    x = torch.randn(rows, s_attn, device=device, dtype=bf)         # attention probabilities rows
    y = torch.softmax(x, -1)
    g = torch.randn_like(x)
    n = x.numel()
    out["softmax"] = (lambda: torch.softmax(x, -1), 2.0 * n * 2)
    out["softmax_backward"] = (lambda: torch._softmax_backward_data(g, y, -1, bf), 3.0 * n * 2)

    rows_v = max(1, rows * s_attn // vocab)
    v = torch.randn(rows_v, vocab, device=device, dtype=f32)      # fp32 logits for the loss
    lv = torch.log_softmax(v, -1)
    gv = torch.randn_like(v)
    nv = v.numel()
    out["log_softmax"] = (lambda: torch.log_softmax(v, -1), 2.0 * nv * 4)
    out["log_softmax_backward"] = (lambda: torch._log_softmax_backward_data(gv, lv, -1, f32), 3.0 * nv * 4)

    c16 = x.reshape(-1)
    c32 = torch.empty(n, device=device, dtype=f32)
    out["cast"] = (lambda: c16.to(f32), n * (2.0 + 4.0))
    out["cast_down"] = (lambda: c32.to(bf), n * (4.0 + 2.0))

    out["dropout"] = (lambda: torch.native_dropout(x, 0.1, True), n * (2.0 + 2.0 + 1.0))
    mask = torch.rand(x.shape, device=device) > 0.1
    out["dropout_backward"] = (lambda: torch.ops.aten.native_dropout_backward(g, mask, 1.0 / 0.9), n * (2.0 + 1.0 + 2.0))

    rows_h = rows * s_attn // h
    xh = torch.randn(rows_h, h, device=device, dtype=bf, requires_grad=True)
    w = torch.ones(h, device=device, dtype=bf, requires_grad=True)
    b = torch.zeros(h, device=device, dtype=bf, requires_grad=True)
    gh = torch.randn(rows_h, h, device=device, dtype=bf)
    nh = xh.numel()
    out["layer_norm"] = (lambda: F.layer_norm(xh.detach(), (h,), w.detach(), b.detach()), nh * 4.0 + rows_h * 8.0)
    ln = F.layer_norm(xh, (h,), w, b)
    out["layer_norm_backward"] = (lambda: torch.autograd.grad(ln, (xh, w, b), gh, retain_graph=True),
                                  nh * 6.0 + rows_h * 8.0)
    out["rms_norm"] = (lambda: F.rms_norm(xh.detach(), (h,), w.detach()), nh * 4.0 + rows_h * 4.0)
    rn = F.rms_norm(xh, (h,), w)
    out["rms_norm_backward"] = (lambda: torch.autograd.grad(rn, (xh, w), gh, retain_graph=True),
                                nh * 6.0 + rows_h * 4.0)

    d = 64  # qk-norm: RMSNorm over one head's features
    xn = xh.detach().reshape(-1, d).requires_grad_(True)
    wn = torch.ones(d, device=device, dtype=bf, requires_grad=True)
    gn = gh.reshape(-1, d)
    rows_n = xn.shape[0]
    out["rms_norm_narrow"] = (lambda: F.rms_norm(xn.detach(), (d,), wn.detach()), nh * 4.0 + rows_n * 4.0)
    rnn = F.rms_norm(xn, (d,), wn)
    out["rms_norm_narrow_backward"] = (lambda: torch.autograd.grad(rnn, (xn, wn), gn, retain_graph=True),
                                       nh * 6.0 + rows_n * 4.0)

    # MoE routing: gather each token's row k times (x[order // k]); the backward accumulates them back
    k = 4
    tokens = rows_h // k
    src = xh.detach()[:tokens]
    idx = torch.randperm(tokens * k, device=device) // k
    vals = gh[: tokens * k]
    zeros = torch.zeros_like(src)
    out["index"] = (lambda: src[idx], tokens * h * 2.0 + idx.numel() * 8.0 + vals.numel() * 2.0)
    out["index_put"] = (lambda: torch.index_put(zeros, (idx,), vals, accumulate=True),
                        2 * tokens * h * 2.0 + idx.numel() * 8.0 + vals.numel() * 2.0)
    # an input broadcast to the output: routing scores over the hidden dim, a [seq, h] table over a batch
    col = torch.randn(rows_h, 1, device=device, dtype=bf)
    xb = xh.detach().reshape(8, rows_h // 8, h)
    table = torch.randn(rows_h // 8, h, device=device, dtype=bf)
    out["broadcast_binary"] = (lambda: (xh.detach() * col, xb * table), 2 * nh * 4.0 + rows_h * 2.0 + table.numel() * 2.0)
    # the same in fp32 (a Hugging Face RMSNorm's x * rsqrt and weight * x): a column, then a [h] weight
    x32, col32, w32 = xh.detach().float(), col.float(), torch.randn(h, device=device)
    out["broadcast_binary_fp32"] = (lambda: (x32 * col32, x32 * w32), 2 * nh * 8.0 + rows_h * 4.0 + h * 4.0)

    # elementwise work that reads through gaps or transposes (the tracer's `strided` ops, TensorIterator's
    # non-vectorized path): the halves of a fused gate_up multiplied (SwiGLU of Phi-3), a unary op on one half,
    # the halves rotate_half concatenates, and heads made contiguous after a transpose
    gu = torch.randn(rows_h, 2 * h, device=device, dtype=bf)
    gate, up = gu[:, :h], gu[:, h:]
    heads = xh.detach().reshape(rows_h, 16, h // 16)  # [tokens, heads, d]

    def strided() -> object:
        return (gate * up, F.silu(gate), torch.cat((up, gate), -1), heads.transpose(0, 1).contiguous())
    out["strided"] = (strided, nh * 2.0 * (3 + 2 + 4 + 2))

    # a short depthwise convolution (LFM2's, a linear-attention layer's; PyTorch's conv_depthwise2d kernels) over
    # channels-last activations made [batch, channels, tokens] by a transpose, as the models do; forward and
    # backward, bytes as the tracer counts them (inputs read, outputs written; the output 3 tokens longer). An
    # H200's profiled trainer steps ran them at 7-9% of the bandwidth (benchmarks/depthwise_conv.py)
    kc = 4
    seq_c = min(rows_h, s_attn)  # rows of 2048 tokens (at most): the kernel is slower on one long row
    xc = xh.detach()[: rows_h // seq_c * seq_c].reshape(-1, seq_c, h).transpose(1, 2).requires_grad_(True)
    wc = torch.randn(h, 1, kc, device=device, dtype=bf, requires_grad=True)
    conv = F.conv1d(xc, wc, padding=kc - 1, groups=h)
    gc = torch.randn_like(conv)
    io = xc.numel() * 2.0 + conv.numel() * 2.0 + wc.numel() * 2.0
    out["conv_depthwise"] = (lambda: (F.conv1d(xc.detach(), wc.detach(), padding=kc - 1, groups=h),
                                      torch.autograd.grad(conv, (xc, wc), gc, retain_graph=True)),
                             io + io + (xc.numel() + wc.numel()) * 2.0)  # backward: io and the input's, weight's gradients

    bias = torch.randn(1, s_attn, s_attn, device=device, dtype=bf)  # baddbmm's broadcast additive input
    batch = max(1, n // (s_attn * s_attn))
    dst = torch.empty(batch, s_attn, s_attn, device=device, dtype=bf)
    out["broadcast_copy"] = (lambda: dst.copy_(bias.expand(batch, s_attn, s_attn)), dst.numel() * 2.0)
    return out


def measure_kernel_classes(device: torch.device, plan: CalibrationPlan, say: Say) -> dict[str, float]:
    """Bytes-per-second of each kernel family (bytes as the tracer counts them), name -> B/s."""
    rows = max(1, plan.class_bytes // (2048 * 2))
    out: dict[str, float] = {}
    for name, (fn, nbytes) in _class_kernels(rows, device).items():
        try:
            t = time_call(fn, device, plan.reps, plan.warmup)
        except RuntimeError as e:  # a kernel this device / torch lacks: keep the generic fraction
            say(f"kernel {name}: skipped ({str(e).splitlines()[0][:80]})")
            continue
        out[name] = nbytes / t
        say(f"kernel {name}: {out[name] / 1e9:.0f} GB/s")
    return out


_HOST_PROBES = {
    "dense": {"name": "host-probe", "model_type": "llama", "vocab_size": 128, "hidden_size": 64,
              "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
              "max_position_embeddings": 64},
    "moe": {"name": "host-probe-moe", "model_type": "qwen2_moe", "vocab_size": 128, "hidden_size": 64,
            "intermediate_size": 128, "moe_intermediate_size": 32, "shared_expert_intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8,
            "num_experts_per_tok": 2, "max_position_embeddings": 64},
}


def _host_times(device: torch.device, plan: CalibrationPlan, probe: str, layers: int
                ) -> tuple[float, float, int, int]:
    """(forward seconds, backward seconds, forward ops, backward ops) of one eager training step of the
    probe model with `layers` blocks (ops counted at the dispatcher, as the tracer counts them)."""
    import torch.nn.functional as F
    from torch.utils._python_dispatch import TorchDispatchMode

    from autoparallel.models import build_model
    from autoparallel.specs import load_model_spec

    model = build_model(load_model_spec(dict(_HOST_PROBES[probe], num_hidden_layers=layers))).to(device)
    # 16 tokens: every kernel is tiny, so the wall time is the host's. (The MoE probe once ran 8 x 2048
    # tokens for the data-dependent shapes of a per-expert loop; the grouped experts have none, and at
    # that size its routing kernels took device time that inflated the per-op host cost.)
    rows, seq = 1, 16
    gen = torch.Generator(device="cpu").manual_seed(0)
    pool = [torch.randint(0, 128, (rows, seq + 1), generator=gen).to(device) for _ in range(16)]
    it = itertools.count()

    class Count(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.n += 1
            return func(*args, **(kwargs or {}))

    def fwd() -> torch.Tensor:
        tokens = pool[next(it) % len(pool)]
        return F.cross_entropy(model(tokens[:, :-1]).flatten(0, -2).float(), tokens[:, 1:].flatten())

    count_f, count_b = Count(), Count()
    with count_f:
        loss = fwd()
    with count_b:
        loss.backward()
    inner = plan.host_inner
    t_f = time_call(fwd, device, reps=plan.reps, warmup=plan.warmup, inner=inner)
    t_fb = time_call(lambda: fwd().backward(), device, reps=plan.reps, warmup=plan.warmup, inner=inner)
    return t_f, max(t_fb - t_f, 0.0), count_f.n, count_b.n


def measure_host(device: torch.device, plan: CalibrationPlan, say: Say, probe: str = "dense") -> tuple[float, float]:
    """Host seconds per dispatched aten op of a training step (forward, backward) of a model whose
    kernels are too small to matter: what eager PyTorch costs per op on this host. `probe`: a tiny dense
    llama-like model, or a mixture-of-experts one (router, sort, gather, grouped GEMMs, scatter), both of
    tiny width on 16 tokens, with routing that changes every step.

    The marginal cost of a block's ops: the probe runs at 2 and 6 blocks and the per-op time is
    (t_6 - t_2) / (n_6 - n_2), so the step's fixed costs (embedding, loss, Python call overhead), which a
    2-block model spreads over few ops, do not inflate it. The per-op ratio of the deeper probe stands
    in where noise makes the difference non-positive."""
    (f2, b2, nf2, nb2), (f6, b6, nf6, nb6) = (_host_times(device, plan, probe, n) for n in (2, 6))
    per_f = (f6 - f2) / (nf6 - nf2) if f6 > f2 and nf6 > nf2 else f6 / max(nf6, 1)
    per_b = (b6 - b2) / (nb6 - nb2) if b6 > b2 and nb6 > nb2 else b6 / max(nb6, 1)
    say(f"host ({probe}): {per_f * 1e6:.1f} us per forward op, {per_b * 1e6:.1f} us per backward op "
        f"(marginal over 2 -> 6 blocks: {nf2} -> {nf6} forward, {nb2} -> {nb6} backward ops; "
        f"whole 2-block step {f2 / nf2 * 1e6:.1f} / {b2 / max(nb2, 1) * 1e6:.1f} us per op)")
    return per_f, per_b


def measure_dynamic_gemm_host(device: torch.device, plan: CalibrationPlan, say: Say) -> tuple[float, float]:
    """Host seconds per GEMM call whose shape was never seen before, and per call of a repeated shape.

    Expert GEMMs run on data-dependent token counts: every new count is a new problem size for which
    the BLAS library picks a kernel (its heuristics) on the host. The GEMMs are tiny (K = N = 64), so
    the host, not the device, sets the pace."""
    n = 200 if device.type != "cpu" else 8
    w = torch.randn(64, 64, device=device, dtype=torch.bfloat16)
    big = torch.randn(8192 + n * 7 + 8, 64, device=device, dtype=torch.bfloat16)
    first = 4096 + 7919 * (int(time.time()) % 97)  # rows never used before in this process
    rows = [first % 4096 + 2048 + 7 * i for i in range(n)]

    def burst(sizes: list[int]) -> float:
        _synchronize(device)
        t0 = time.perf_counter()
        for m in sizes:
            torch.mm(big[:m], w)
        _synchronize(device)
        return (time.perf_counter() - t0) / len(sizes)

    burst([1024] * 20)  # warm the library for this layout
    fresh = burst(rows)
    seen = burst([rows[0]] * n)
    say(f"host per GEMM call: {fresh * 1e6:.1f} us for a new shape, {seen * 1e6:.1f} us for a repeated one")
    return fresh, seen


def measure(device: torch.device, plan: CalibrationPlan, say: Say) -> Measurements:
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
    l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 * 2**20) \
        if device.type == "cuda" else 32 * 2**20
    meas = Measurements(device=str(device), device_name=name, torch_version=str(torch.__version__),
                        date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    meas.large_bandwidth_bytes = plan.large_bandwidth_bytes
    meas.launch_graph_s, meas.launch_eager_s = measure_launch(device, say)
    meas.bandwidth = measure_bandwidth(device, plan, say)
    meas.gemm = measure_gemms(device, plan, say, l2)
    meas.gemm += measure_fp8_gemms(device, plan, say, l2)
    meas.grouped_gemm = measure_grouped_gemms(device, plan, say)
    meas.attention = measure_attention(device, plan, say)
    meas.kernel_classes = measure_kernel_classes(device, plan, say)
    meas.host_fwd_s, meas.host_bwd_s = measure_host(device, plan, say)
    meas.host_moe_fwd_s, meas.host_moe_bwd_s = measure_host(device, plan, say, probe="moe")
    meas.host_gemm_new_shape_s, meas.host_gemm_seen_shape_s = measure_dynamic_gemm_host(device, plan, say)
    meas.collectives, meas.collective_span = measure_collectives(device, plan, say)
    return meas


# ---- fitting --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Fit:
    """Fitted efficiencies (profile schema keys) and diagnostics."""
    gemm_max: float
    gemm_half_flops: float
    memory_bound: float
    kernel_overhead_s: float
    gemm_rms_log_error: float            # over the bf16 GEMMs, after the fit
    attention_fwd: float | None = None   # curve maximum on flop_counter FLOPs
    attention_bwd: float | None = None
    attention_fwd_half: float | None = None  # their curves' half-sizes [FLOPs]
    attention_bwd_half: float | None = None
    # compute.attention_times' four terms per phase (fit_attention_terms), where enough shapes were timed
    attention_fwd_terms: tuple[float, float, float, float] | None = None
    attention_bwd_terms: tuple[float, float, float, float] | None = None
    attention_masked_fwd_terms: tuple[float, float, float, float] | None = None
    attention_masked_bwd_terms: tuple[float, float, float, float] | None = None
    collective_efficiency: float | None = None
    collective_latency_s: float | None = None
    collective_span: str = "intra"
    per_dtype_gemm: dict[str, float] = field(default_factory=dict)  # best achieved fraction of peak
    gemm_unaligned: float | None = None  # curve maximum of GEMMs with an odd dim (50257)
    gemm_grouped: float | None = None    # curve maximum of torch._grouped_mm (MoE experts), per group
    gemm_grouped_half: float | None = None  # its half-size [FLOPs of one group]
    gemm_fp8: float | None = None        # curve maximum of the FP8 GEMMs against the fp8 peak
    memory_fractions: dict[str, float] = field(default_factory=dict)  # kernel family -> bandwidth fraction
    host_s_per_op: float = 0.0           # host seconds per dispatched op of an eager training step
    host_moe_s_per_op: float = 0.0       # the same in a mixture-of-experts model


def _clip_fraction(x: float) -> float:
    return float(min(1.0, max(1e-3, x)))


def fit_memory_bound(samples: list[BandwidthSample], bandwidth: float, large_bytes: float) -> float:
    """Median achieved / datasheet bandwidth over the samples whose operands are >= large_bytes
    (per-kernel overhead is negligible there); all samples when none is that large."""
    big = [s for s in samples if s.bytes >= 2 * large_bytes] or samples
    if not big:
        raise UserError("calibrate: no bandwidth samples to fit memory_bound")
    return _clip_fraction(statistics.median(s.bytes / s.seconds / bandwidth for s in big))


def _gemm_model(flops: np.ndarray, moved: np.ndarray, peak: float, bw: float, mem_eff: float, overhead: float,
                gmax: np.ndarray, half: np.ndarray) -> np.ndarray:
    """cost_models.compute.op_times for matmuls, broadcast over candidate (gmax, half) grids [s]."""
    t_c = (flops + half) / (peak * gmax)
    return np.maximum(t_c, moved / (bw * mem_eff)) + overhead


def fit_gemm_curve(flops: np.ndarray, moved: np.ndarray, seconds: np.ndarray, peak: float, bw: float,
                   mem_eff: float, overhead: float, max_fraction: float = 1.0) -> tuple[float, float, float]:
    """(gemm_max, gemm_half_flops, rms log error) minimizing sum log^2(t_model / t_measured).

    A log-spaced grid, then a finer grid around the best point (the objective is smooth and the
    curve has two parameters, so this finds the global minimum without a solver). `max_fraction`
    bounds the curve's maximum: 1 for GEMMs; 2 for causal attention, whose counted FLOPs include the
    masked half that the kernels skip."""
    flops, moved, seconds = (np.asarray(a, dtype=float)[:, None, None] for a in (flops, moved, seconds))
    gmax = np.linspace(0.05, max_fraction, int(round(190 * max_fraction)) + 1)[None, :, None]
    half = np.concatenate([[0.0], np.logspace(5, 13, 321)])[None, None, :]
    err = (np.log(_gemm_model(flops, moved, peak, bw, mem_eff, overhead, gmax, half) / seconds) ** 2).mean(0)
    i, j = np.unravel_index(np.argmin(err), err.shape)
    g0, h0 = float(gmax[0, i, 0]), float(half[0, 0, j])
    gmax2 = np.linspace(max(0.01, g0 - 0.01), min(max_fraction, g0 + 0.01), 81)[None, :, None]
    lo, hi = (h0 / 1.1, h0 * 1.1) if h0 > 0 else (0.0, 1e5)
    half2 = np.linspace(lo, hi, 161)[None, None, :]
    err2 = (np.log(_gemm_model(flops, moved, peak, bw, mem_eff, overhead, gmax2, half2) / seconds) ** 2).mean(0)
    i, j = np.unravel_index(np.argmin(err2), err2.shape)
    g, h = float(gmax2[0, i, 0]), float(half2[0, 0, j])
    if err2[i, j] > err[np.unravel_index(np.argmin(err), err.shape)]:
        g, h = g0, h0
    best = float(min(err2.min(), err.min()))
    return g, max(h, 1.0), math.sqrt(best)


def fit_attention_terms(samples: list[AttentionSample], phase: str, peak: float, bw: float
                        ) -> tuple[float, float, float, float]:
    """compute.attention_times' (flop_max, score_ps, row_bytes, fixed_us) for `phase`: least squares in
    relative error of t = F x0 + S2 x1 + E x2 + x3 (F counted FLOPs, S2 = B H S^2 score elements, E =
    B H S D query elements), each coefficient kept >= 0 (a negative one is dropped and the rest refit: a
    negative time per element fits noise). On an H200 the four terms met 26 shapes (B 1-32, S 512-16384,
    D 64 and 128, GQA and not) within 7% forward and 10% backward, where one FLOP curve missed by 20-30%
    (benchmarks/results/raw/attention_timing_h200_s17.json)."""
    t = np.array([x.fwd_seconds if phase == "fwd" else x.bwd_seconds for x in samples])
    cols = np.array([[x.fwd_flops if phase == "fwd" else x.bwd_flops, x.batch * x.heads * x.seq * x.seq,
                      x.batch * x.heads * x.seq * x.head_dim, 1.0] for x in samples])
    keep = [0, 1, 2, 3]
    while True:
        coef, *_ = np.linalg.lstsq(cols[:, keep] / t[:, None], np.ones_like(t), rcond=None)
        if (coef >= 0).all() or len(keep) == 1:
            break
        keep.pop(int(np.argmin(coef)))
    x = np.zeros(4)
    x[keep] = np.maximum(coef, 0.0)
    flop_max = 1.0 / (x[0] * peak) if x[0] > 0 else 1e3  # no FLOP term: an unbounded rate
    return flop_max, x[1] * 1e12, x[2] * bw, x[3] * 1e6


def padded_samples(samples: list[AttentionSample], profile: Any) -> list[AttentionSample]:
    """`samples` at the head dimension their kernel computes with (compute.padded_head_dim under `profile`'s
    tiles: FLOPs scaled, query elements at the padded width), as compute.attention_times prices them, so that
    terms fitted on heads between tiles (80, 96) mean what the model reads them as."""
    out = []
    for x in samples:
        padded = padded_head_dim(x.head_dim, profile, "flash" if x.backend == "flash" and not x.masked else "default")
        k = padded / x.head_dim
        out.append(replace(x, head_dim=padded, fwd_flops=x.fwd_flops * k, bwd_flops=x.bwd_flops * k))
    return out


def fit_attention_tile_scale(samples: list[AttentionSample], profile: Any
                             ) -> dict[str, list[float]]:
    """calibration.attention_tile_flop_scale: per head-dim tile past 128 (compute.padded_head_dim) that
    `samples` reach, the (forward, backward) factor on the profile's causal FLOP rate that fits them, the
    other three terms held: least squares in relative error of t = A / s + R (A the FLOP term at s = 1, R the
    rest), closed form in 1 / s. The causal terms are fitted at heads of 64 and 128; an H200's 192- and
    256-wide kernels ran the same FLOPs 17-49% slower (benchmarks/results/raw/attention_head_dims_h200_s94.json)."""
    base = {k: v for k, v in profile.calibration.items() if k != "attention_tile_flop_scale"}
    at_one = replace(profile, calibration=base)
    tiles: dict[int, list[AttentionSample]] = {}
    for x in samples:
        tiles.setdefault(padded_head_dim(x.head_dim, at_one), []).append(x)
    out: dict[str, list[float]] = {}
    for tile, xs in sorted(tiles.items()):
        if tile <= 128:
            continue
        pair = []
        for phase in ("fwd", "bwd"):
            terms = base[f"attention_{phase}_terms"]
            no_flops = replace(profile, calibration={**base, f"attention_{phase}_terms": [1e30, *terms[1:]]})
            t = np.array([x.fwd_seconds if phase == "fwd" else x.bwd_seconds for x in xs])
            f = np.array([x.fwd_flops if phase == "fwd" else x.bwd_flops for x in xs])
            full = np.array([attention_times(f[i:i + 1], phase, x.seq, x.head_dim, at_one, "bf16")[0]
                             for i, x in enumerate(xs)])
            rest = np.array([attention_times(f[i:i + 1], phase, x.seq, x.head_dim, no_flops, "bf16")[0]
                             for i, x in enumerate(xs)])
            a = (full - rest) / t
            inv = float(np.sum(a * (1 - rest / t)) / np.sum(a * a))
            pair.append(round(1.0 / inv, 3) if inv > 0 else 1.0)
        out[str(tile)] = pair
    return out


def fit_collectives(samples: list[CollectiveSample], link_bandwidth: float) -> tuple[float, float]:
    """(efficiency, per-hop latency s): least squares in relative error of
    t = f S / (B e) + k a  with (f, k) = cost_models.comm.collective_terms (all-reduce 2(n-1)/n and 2(n-1);
    all-gather, reduce-scatter, all-to-all (n-1)/n and n-1; send/recv 1 and 1)."""
    rows, rhs = [], []
    for s in samples:
        f, k = collective_terms(s.op, s.world)
        rows.append([f * s.bytes / link_bandwidth / s.seconds, k / s.seconds])
        rhs.append(1.0)
    x, *_ = np.linalg.lstsq(np.array(rows), np.array(rhs), rcond=None)
    inv_eff, lat = float(x[0]), float(x[1])
    if lat < 0:  # a negative latency fits noise: refit the bandwidth term alone
        lat = 0.0
        a = np.array(rows)[:, :1]
        inv_eff = float(np.linalg.lstsq(a, np.array(rhs), rcond=None)[0][0])
    return _clip_fraction(1.0 / inv_eff if inv_eff > 0 else 1.0), lat


def fit_curve_max(flops: np.ndarray, moved: np.ndarray, seconds: np.ndarray, peak: float, bw: float,
                  mem_eff: float, overhead: float, half: float) -> float:
    """The maximum of the e(F) curve with gemm_half_flops fixed at `half` (the cost model shares one
    half-size between its matrix-unit classes), minimizing sum log^2(t_model / t_measured)."""
    flops, moved, seconds = (np.asarray(a, dtype=float)[:, None] for a in (flops, moved, seconds))
    grid = np.linspace(0.005, 1.0, 996)[None, :]
    err = (np.log(_gemm_model(flops, moved, peak, bw, mem_eff, overhead, grid, np.array(half)) / seconds) ** 2).mean(0)
    return float(grid[0, int(np.argmin(err))])


def is_aligned(s: GemmSample, multiple: int = 8) -> bool:
    return s.m % multiple == 0 and s.n % multiple == 0 and s.k % multiple == 0


def fit(meas: Measurements, base: Any, plan: CalibrationPlan | None = None) -> Fit:
    """Fit the profile efficiencies to `meas` (see the module docstring); `base` is a HardwareProfile."""
    plan = plan or CalibrationPlan.full()
    peak = base.peak("bf16")
    bw = base.memory_bandwidth
    same_dtype = [s for s in meas.bandwidth if s.op != "cast"]  # casts are a class of their own
    mem_eff = fit_memory_bound(same_dtype or meas.bandwidth, bw, meas.large_bandwidth_bytes or plan.large_bandwidth_bytes)
    overhead = meas.launch_graph_s or meas.launch_eager_s
    bf16 = [s for s in meas.gemm if s.dtype == "bf16" and is_aligned(s)]
    if not bf16:
        raise UserError("calibrate: no aligned bf16 GEMM samples to fit gemm_max / gemm_half_flops")

    def arrays(samples: list[GemmSample] | list[GroupedGemmSample]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.array([x.flops for x in samples]), np.array([x.bytes for x in samples]),
                np.array([x.seconds for x in samples]))

    gmax, half, rms = fit_gemm_curve(*arrays(bf16), peak, bw, mem_eff, overhead)
    unaligned = [s for s in meas.gemm if s.dtype == "bf16" and not is_aligned(s)]
    u_max = fit_curve_max(*arrays(unaligned), peak, bw, mem_eff, overhead, half) if unaligned else None
    grouped = meas.grouped_gemm
    g_max = g_half = None
    if grouped:  # per group (the launch overhead once per kernel): F/G, bytes/G, (t - overhead)/G
        per_group = [np.array([x.flops / x.groups for x in grouped]), np.array([x.bytes / x.groups for x in grouped]),
                     np.array([max(x.seconds - overhead, 1e-9) / x.groups for x in grouped])]
        g_max, g_half, _ = fit_gemm_curve(*per_group, peak, bw, mem_eff, 0.0)
    fp8 = [s for s in meas.gemm if s.dtype == "fp8" and is_aligned(s)]
    g8 = None
    if fp8 and "fp8" in base.peak_flops:  # half size as compute.fp8_gemm_curve derives it
        peak8 = base.peak("fp8")
        g8 = fit_curve_max(*arrays(fp8), peak8, bw, mem_eff, overhead, half * peak8 / peak)
    per_dtype: dict[str, float] = {}
    for s in meas.gemm:
        try:
            p = base.peak(s.dtype)
        except UserError:
            continue
        if is_aligned(s):
            per_dtype[s.dtype] = max(per_dtype.get(s.dtype, 0.0), s.flops / s.seconds / p)
    att_fwd = att_bwd = att_fwd_half = att_bwd_half = att_fwd_terms = att_bwd_terms = None
    causal = padded_samples([x for x in meas.attention if not x.masked], base)
    masked = padded_samples([x for x in meas.attention if x.masked], base)
    masked_terms = ((fit_attention_terms(masked, "fwd", peak, bw), fit_attention_terms(masked, "bwd", peak, bw))
                    if len(masked) >= 2 * len(ATTENTION_TERMS) else (None, None))
    if len(causal) >= 2 * len(ATTENTION_TERMS):
        att_fwd_terms = fit_attention_terms(causal, "fwd", peak, bw)
        att_bwd_terms = fit_attention_terms(causal, "bwd", peak, bw)
    elif causal:
        a = causal
        moved = np.array([4.0 * x.batch * x.heads * x.seq * x.head_dim * 2 for x in a])  # q, k, v, out bf16
        # flash kernels saturate more slowly than GEMMs (their FLOPs grow with seq^2): a curve of their own
        att_fwd, att_fwd_half, _ = fit_gemm_curve(np.array([x.fwd_flops for x in a]), moved,
                                                  np.array([x.fwd_seconds for x in a]), peak, bw, mem_eff, overhead,
                                                  CAUSAL_MAX_FRACTION)
        att_bwd, att_bwd_half, _ = fit_gemm_curve(np.array([x.bwd_flops for x in a]), 2 * moved,
                                                  np.array([x.bwd_seconds for x in a]), peak, bw, mem_eff, overhead,
                                                  CAUSAL_MAX_FRACTION)
    fractions = {k: _clip_fraction(v / bw) for k, v in meas.kernel_classes.items() if k != "cast_down"}
    if "cast_down" in meas.kernel_classes and "cast" in fractions:  # both directions of a dtype cast
        fractions["cast"] = _clip_fraction(statistics.mean([meas.kernel_classes["cast"] / bw,
                                                            meas.kernel_classes["cast_down"] / bw]))
    # a training step dispatches about two backward ops per forward op (the traced llama/gpt blocks)
    host = (meas.host_fwd_s + 2 * meas.host_bwd_s) / 3 if meas.host_fwd_s else 0.0
    host_moe = (meas.host_moe_fwd_s + 2 * meas.host_moe_bwd_s) / 3 if meas.host_moe_fwd_s else 0.0
    coll_eff = coll_lat = None
    if meas.collectives:
        link = base.intra_bandwidth if meas.collective_span == "intra" else base.inter_bandwidth
        coll_eff, coll_lat = fit_collectives(meas.collectives, link)
    return Fit(gemm_max=_clip_fraction(gmax), gemm_half_flops=half, memory_bound=mem_eff,
               kernel_overhead_s=overhead, gemm_rms_log_error=rms, attention_fwd=att_fwd, attention_bwd=att_bwd,
               collective_efficiency=coll_eff, collective_latency_s=coll_lat,
               collective_span=meas.collective_span, per_dtype_gemm=per_dtype, gemm_unaligned=u_max,
               gemm_grouped=g_max, gemm_grouped_half=g_half, gemm_fp8=g8,
               attention_fwd_half=att_fwd_half, attention_bwd_half=att_bwd_half,
               attention_fwd_terms=att_fwd_terms, attention_bwd_terms=att_bwd_terms,
               attention_masked_fwd_terms=masked_terms[0], attention_masked_bwd_terms=masked_terms[1],
               memory_fractions=fractions, host_s_per_op=host, host_moe_s_per_op=host_moe)


def _r(x: float, digits: int = 4) -> float:
    return float(f"{x:.{digits}g}")


def profile_extra(base: Any, meas: Measurements, f: Fit) -> dict[str, Any]:
    """The `extra` mapping for hardware_profiles.profile_to_yaml: fitted efficiencies + calibration."""
    from hardware_profiles.units import format_time

    eff: dict[str, Any] = {"gemm_max": _r(f.gemm_max), "gemm_half_flops": _r(f.gemm_half_flops),
                           "memory_bound": _r(f.memory_bound), "kernel_overhead_us": _r(f.kernel_overhead_s * 1e6)}
    extra: dict[str, Any] = {"efficiency": eff}
    if f.collective_efficiency is not None:
        eff[f"collective_{f.collective_span}"] = _r(f.collective_efficiency)
        section = "node" if f.collective_span == "intra" else "network"
        extra[section] = {"latency": format_time(max(f.collective_latency_s or 0.0, 1e-9))}
    best_bw = max((s.bytes / s.seconds for s in meas.bandwidth), default=0.0)
    best_gemm = max((s.flops / s.seconds for s in meas.gemm if s.dtype == "bf16"), default=0.0)
    cal: dict[str, Any] = {
        "device": meas.device_name, "date": meas.date, "torch": meas.torch_version,
        "gemm_bf16_best_tflops": _r(best_gemm / 1e12), "gemm_fit_rms_log_error": _r(f.gemm_rms_log_error, 3),
        "gemm_best_fraction_by_dtype": {k: _r(v, 3) for k, v in sorted(f.per_dtype_gemm.items())},
        "memory_best_gbps": _r(best_bw / 1e9), "launch_graph_us": _r(meas.launch_graph_s * 1e6),
        "launch_eager_us": _r(meas.launch_eager_s * 1e6),
        "collectives": ("measured over " + str(meas.collectives[0].world) + " ranks" if meas.collectives
                        else "not measured (world size 1)"),
    }
    if f.attention_fwd_terms is not None and f.attention_bwd_terms is not None:
        cal["attention_fwd_terms"] = [_r(x, 4) for x in f.attention_fwd_terms]
        cal["attention_bwd_terms"] = [_r(x, 4) for x in f.attention_bwd_terms]
        cal["attention_flops"] = ("torch.utils.flop_counter convention: causal counted as full; terms "
                                  + ", ".join(ATTENTION_TERMS) + " (cost_models.compute.attention_times)")
    if f.attention_masked_fwd_terms is not None and f.attention_masked_bwd_terms is not None:
        cal["attention_masked_fwd_terms"] = [_r(x, 4) for x in f.attention_masked_fwd_terms]
        cal["attention_masked_bwd_terms"] = [_r(x, 4) for x in f.attention_masked_bwd_terms]
    if f.attention_fwd is not None:
        cal["attention_fwd_max"] = _r(f.attention_fwd, 3)
        cal["attention_bwd_max"] = _r(f.attention_bwd, 3)
        cal["attention_fwd_half_flops"] = _r(f.attention_fwd_half or 1.0, 3)
        cal["attention_bwd_half_flops"] = _r(f.attention_bwd_half or 1.0, 3)
        cal["attention_flops"] = "torch.utils.flop_counter convention: causal counted as full"
    if f.gemm_unaligned is not None:
        cal["gemm_unaligned_max"] = _r(f.gemm_unaligned, 3)
    if f.gemm_fp8 is not None:
        cal["gemm_fp8_max"] = _r(f.gemm_fp8, 3)
    if f.gemm_grouped is not None:
        cal["gemm_grouped_max"] = _r(f.gemm_grouped, 3)
        cal["gemm_grouped_half_flops"] = _r(f.gemm_grouped_half or 1.0, 3)
    if f.memory_fractions:
        cal["memory_fraction"] = {k: _r(v, 3) for k, v in sorted(f.memory_fractions.items())}
    if f.host_s_per_op:
        cal["host_us_per_op"] = _r(f.host_s_per_op * 1e6, 3)
        cal["host_us_per_op_fwd_bwd"] = [_r(meas.host_fwd_s * 1e6, 3), _r(meas.host_bwd_s * 1e6, 3)]
    if meas.host_gemm_new_shape_s:
        cal["host_us_per_new_gemm_shape"] = _r(meas.host_gemm_new_shape_s * 1e6, 3)
        cal["host_us_per_seen_gemm_shape"] = _r(meas.host_gemm_seen_shape_s * 1e6, 3)
    if f.host_moe_s_per_op:
        cal["host_us_per_op_moe"] = _r(f.host_moe_s_per_op * 1e6, 3)
        cal["host_us_per_op_moe_fwd_bwd"] = [_r(meas.host_moe_fwd_s * 1e6, 3), _r(meas.host_moe_bwd_s * 1e6, 3)]
    extra["calibration"] = cal
    stamp = f"Efficiencies fitted by `autoparallel calibrate` on {meas.device_name} ({meas.date})."
    # a re-calibrated profile replaces the previous stamp instead of growing a list of them
    notes = base.notes.split("Efficiencies fitted by `autoparallel calibrate`")[0].strip()
    extra["notes"] = (notes + " " + stamp).strip()
    extra["sources"] = list(base.sources) + [f"autoparallel calibrate, {meas.device_name}, torch "
                                             f"{meas.torch_version}, {meas.date}"]
    return extra


# ---- entry points ---------------------------------------------------------------------------------------
def _join_process_group() -> int:
    """Under torchrun (WORLD_SIZE > 1) start the process group the collective measurements use, one GPU per
    local rank; returns this rank (0 without torchrun)."""
    import torch.distributed as dist

    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world < 2 or not torch.cuda.is_available():
        return 0
    if not dist.is_initialized():
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dist.init_process_group("nccl", device_id=torch.device("cuda", local))
    return dist.get_rank()


def detect_accelerator() -> torch.device | None:
    """The local accelerator (CUDA or ROCm, else another torch.accelerator backend), or None."""
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    acc = getattr(torch, "accelerator", None)
    if acc is not None and acc.is_available():
        dev = acc.current_accelerator()
        if dev is not None and dev.type not in ("cpu", "mps"):
            return torch.device(dev.type, 0)
    return None


def _stderr(msg: str) -> None:
    print(f"[calibrate] {msg}", file=sys.stderr, flush=True)


def calibrate(device: torch.device, base: Any, plan: CalibrationPlan, say: Say = _stderr
              ) -> tuple[str, Measurements, Fit]:
    """Measure `device`, fit, and return (profile YAML text, measurements, fit)."""
    from hardware_profiles import profile_to_yaml

    meas = measure(device, plan, say)
    f = fit(meas, base, plan)
    return profile_to_yaml(base, extra=profile_extra(base, meas, f)), meas, f


def _write(path: Path, text: str, output: str) -> None:
    try:
        path.write_text(text)
    except OSError as e:
        raise UserError(f"calibrate: cannot write {output} ({e.strerror}); pass a writable --output path") from None


def _base_for(device_name: str, total_memory: int) -> str:
    from hardware_profiles import list_profiles, match_device

    base = match_device(device_name, total_memory)
    if base is None:
        raise UserError(f"calibrate: no shipped profile matches the device {device_name!r}; pass --base "
                        f"NAME (one of {', '.join(list_profiles())}) or a YAML path to start from")
    return base


def _refit(path: str, base: str | None, output: str) -> Any:
    """Fit a saved measurements file and write the profile (`calibrate --from-measurements`)."""
    from hardware_profiles import load_profile, profile_to_yaml, validate_profile_file

    data = load_document(Path(path), "calibration measurements file", json_only=True)
    try:
        meas = Measurements.from_dict(data)
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise UserError(f"calibrate: {path} is not a calibration measurements file ({e}); pass the "
                        f".measurements.json that `autoparallel calibrate` wrote") from None
    profile = load_profile(base or _base_for(meas.device_name, 0))
    f = fit(meas, profile)
    out = Path(output)
    _write(out, profile_to_yaml(profile, extra=profile_extra(profile, meas, f)), output)
    _stderr(f"refitted {path} (measured {meas.date} on {meas.device_name}): wrote {out}")
    return validate_profile_file(out)


def run_calibration(base: str | None = None, output: str = "calibrated.yaml", quick: bool = False,
                    measurements: str | None = None) -> Any:
    """`autoparallel calibrate`: measure the local accelerator, write a profile YAML to `output` and the
    raw measurements to `output` with suffix .measurements.json; progress on stderr. With
    `measurements` (a saved .measurements.json) nothing is measured: the file is refitted, e.g. after
    the cost model's formulas changed. Returns the written HardwareProfile."""
    from hardware_profiles import load_profile, validate_profile_file

    if measurements is not None:
        return _refit(measurements, base, output)
    rank = _join_process_group()
    device = detect_accelerator()
    if device is None:
        raise UserError("calibrate: no accelerator found on this host (torch sees no CUDA, ROCm or other "
                        "device); run `autoparallel calibrate` on the machine whose GPUs you want to profile")
    if base is None:
        name = torch.cuda.get_device_name(device) if device.type == "cuda" else device.type
        total = torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else 0
        base = _base_for(name, total)
        _stderr(f"base profile: {base} (detected from {name!r})")
    profile = load_profile(base)
    plan = CalibrationPlan.quick() if quick else CalibrationPlan.full()
    text, meas, f = calibrate(device, profile, plan)
    if rank != 0:  # every rank measured (the collectives need all of them); rank 0 writes
        return profile
    out = Path(output)
    raw = out.with_suffix(".measurements.json")
    _write(out, text, output)
    _write(raw, json.dumps(meas.to_dict(), indent=1) + "\n", output)
    _stderr(f"gemm_max {f.gemm_max:.3f}, gemm_half_flops {f.gemm_half_flops:.3g}, memory_bound "
            f"{f.memory_bound:.3f}, kernel overhead {f.kernel_overhead_s * 1e6:.2f} us "
            f"(GEMM fit rms log error {f.gemm_rms_log_error:.3f})")
    _stderr(f"wrote {out} and {raw}")
    return validate_profile_file(out)
