"""Compute time of one operator: a roofline with size-dependent efficiency, per kernel class.

    t_op = max( F / (P_peak * e_c(F)),  Bytes / (BW_mem * m_c) ) + t_copy + t_launch      [seconds]

F in FLOPs, P_peak in FLOP/s for the compute dtype, Bytes moved to/from device memory, BW_mem in
bytes/s. Matrix-unit ops reach e_c(F) = max_c * F / (F + gemm_half_flops): small GEMMs cannot fill
the machine, large ones approach max_c. Other ops are bandwidth-bound at the fraction m_c.

Kernel classes c (`classify`); the profile's `efficiency` section gives the generic values, and a
profile written by `autoparallel calibrate` may carry measured per-class values under `calibration`
(absent keys keep the generic value, so uncalibrated profiles behave as before):

  gemm              max = gemm_max                                   mm, addmm, bmm, baddbmm, conv, ...
  gemm_unaligned    max = calibration.gemm_unaligned_max             a GEMM with M, N or K odd: cuBLAS falls
                    back to 1-element-aligned kernels (GPT-2's 50257 vocab)
  gemm_align2       max = calibration.gemm_align2_max                a GEMM with M, N and K even, one not a
                    multiple of 8 elements: 2- or 4-element-aligned kernels (OLMo 3's 100278 vocab; on an
                    H200 0.279 of peak for both, against 0.144 odd and 0.70 aligned: benchmarks/gemm_alignment.py)
                    (default: gemm_unaligned_max, what the class was priced at before it had its own)
  gemm_grouped      max = calibration.gemm_grouped_max               torch._grouped_mm (MoE experts: one
                    kernel over G groups): the curve is evaluated at the FLOPs of one group, F / G, with
                    half-size calibration.gemm_grouped_half_flops, so t = (F + G F_half) / (P max): each
                    group pays a fixed cost, as G separate GEMMs would (small experts run slowly)
  gemm_fp32         max = calibration.gemm_best_fraction_by_dtype.fp32, of the fp32 peak: a GEMM on fp32
                    inputs in a bf16 model (GPT-J's attention scores upcast before their product) runs
                    on the fp32 units (PyTorch's default allows no TF32), 1/15 of an H200's bf16 rate
  attention_fwd/bwd fused attention kernels (`attention_times`), where the profile has the four terms
                    calibration.attention_{fwd,bwd}_terms = [flop_max, score_ps, row_bytes, fixed_us]:
                        t = F / (P flop_max) + S2 score_ps + E row_bytes / BW + fixed_us
                    F the FLOPs torch.utils.flop_counter counts (causal counted as full), S2 = B H S_q S_k
                    score elements (the softmax's exponentials: Hopper's special-function units bound
                    them, whatever the head dimension), E = B H S_q D query elements (the per-row loads,
                    stores and, backward, the dQ accumulation and GQA's head reduction): a sum, since one
                    curve in F could not tell a batch of short heads from one long head (an H200's kernels
                    ran the same FLOPs 2x apart). The same terms of other kernels: attention_masked_*
                    (an additive mask, every score computed), attention_flash_* (SDPA's flash backend,
                    FlashAttention-2, for runtimes that ran it: ATTENTION_KERNELS). Older calibrations:
                    calibration.attention_fwd_max /
                    _bwd_max with half-size attention_fwd_half_flops / _bwd_half_flops, GEMM-like
  softmax, log_softmax, cast, dropout, layer_norm, rms_norm and their backwards, rms_norm_narrow
  (<= 256 features: qk-norm), index (row gather), index_put (its accumulating backward),
  broadcast_binary (an elementwise op with a broadcast input: RoPE, scaling by routing scores; in fp32
  throughout and along leading or trailing dimensions only, broadcast_binary_fp32: a Hugging Face RMSNorm's
  products in its fp32 compute), strided (an elementwise op, cast or concatenation that reads through gaps
  or transposes: a slice of a fused qkv or gate_up projection, heads made contiguous; both run
  TensorIterator's non-vectorized path), conv_depthwise (a convolution, or its backward, with one input channel
  a group: the short convolutions of LFM2 and of linear-attention layers, which PyTorch runs in its own
  depthwise kernels, conv_depthwise2d, at a few percent of the bandwidth)
                    m = calibration.memory_fraction[class]           measured kernel families, on the
                    bytes the tracer counts for the op (its inputs read, its outputs written)
  other             m = memory_bound

t_copy: an op that first copies its additive input into its output (baddbmm: cuBLAS then accumulates
with beta = 1) moves copy_bytes more: written by a copy kernel (at the `broadcast_copy` fraction) and
read once more by the GEMM.

Host floor (`host_floor`, `stretch_to`): eager PyTorch issues every op from the host (Python, dispatcher,
autograd engine); when the device runs ops faster than the host issues them, the host sets the pace:
a phase of n ops takes at least n * the calibrated host time per op of that phase (forward or backward;
the MoE probe's in expert blocks); an expert GEMM with a data-dependent shape, from a per-expert loop,
also pays host_us_per_new_gemm_shape.

Runtime terms (the trainer's execution, fitted from AutoParallelTrainer's own steps): the trainer's
own host work (FSDP hooks, checkpointing, DTensor dispatch, pipeline bookkeeping: cost_models.host)
joins the floor; under torch.compile the non-matrix ops move a calibrated fraction of their traced
bytes (`compiled_times`) and the floor is the compiled graph's own (`compiled_host_floor`).

Optimizer step: `fsdp_update_time` for AutoParallelTrainer (FSDP2 mixed precision: the fused AdamW
at calibration.memory_fraction.adamw, FSDP's copies at calibration.fsdp_copy_fraction, its fp32 gradient
accumulation over micro-batches at calibration.fsdp_accumulate_fraction), `update_time` for
Megatron-LM's layout: the mixed-precision update of a runtime that keeps fp32 master weights
and a persistent gradient buffer (Megatron-LM's layout; CostModel._memory's accounting), per step:
    N (28 / m + (4 + p) / m_cast + g / m) / BW          fused Adam(W): reads p, g, m, v, writes p, m, v in
                                                        fp32; master -> p-byte copy; zero the buffer
  + M N (p + 2 g) / (BW m_acc)                          each of M micro-batches adds its p-byte gradient
                                                        into the g-byte buffer (m_acc = m_cast if p != g)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from cost_models.comm import DpSchedule
from hardware_profiles import HardwareProfile

# aten ops whose FLOPs run on matrix units (tensor cores); all others are treated as vector/memory ops.
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_grouped_mm",
              "scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")

MEMORY_CLASSES = ("softmax", "softmax_backward", "log_softmax", "log_softmax_backward", "cast", "dropout",
                  "dropout_backward", "layer_norm", "layer_norm_backward", "rms_norm", "rms_norm_backward",
                  "rms_norm_narrow", "rms_norm_narrow_backward", "index", "index_put", "broadcast_binary",
                  "broadcast_binary_fp32", "strided", "conv_depthwise")
NARROW_NORM = 256  # RMSNorm over at most this many features (qk-norm over one head): a kernel of its own
CLASSES = ("other", "gemm", "gemm_unaligned", "gemm_grouped", "gemm_fp32", "attention_fwd",
           "attention_bwd") + MEMORY_CLASSES + ("gemm_align2",)
CLASS_CODE = {c: i for i, c in enumerate(CLASSES)}
_GEMM_BASES = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear")
_BY_BASE = {
    "_softmax": "softmax", "_softmax_backward_data": "softmax_backward",
    "_log_softmax": "log_softmax", "_log_softmax_backward_data": "log_softmax_backward",
    "_to_copy": "cast",
    "native_dropout": "dropout", "native_dropout_backward": "dropout_backward",
    "native_layer_norm": "layer_norm", "native_layer_norm_backward": "layer_norm_backward",
    "fused_rms_norm": "rms_norm", "_fused_rms_norm": "rms_norm",
    "fused_rms_norm_backward": "rms_norm_backward", "_fused_rms_norm_backward": "rms_norm_backward",
    "index": "index", "index_put": "index_put", "index_put_": "index_put", "_index_put_impl_": "index_put",
}
_BROADCASTING = ("mul", "add", "sub", "rsub", "div", "where", "maximum", "minimum", "pow", "masked_fill")
ADAM_BYTES = 28  # fused Adam(W) per fp32 parameter: reads p, g, m, v (16 B) and writes p, m, v (12 B)
# Gradient clipping by the global norm (the trainer's max_grad_norm, trainer/grad_norm.py) per fp32 gradient
# entry: a multi-tensor norm reads g (4 B), the scaling reads and writes it (8 B)
CLIP_BYTES = 12


def _base(op_name: str) -> str:
    """'aten.mm.default' -> 'mm'; 'autoparallel.fused_rms_norm.default' -> 'fused_rms_norm'."""
    parts = op_name.split(".")
    return parts[1] if len(parts) >= 2 else op_name


def is_matmul(op_name: str) -> bool:
    base = op_name.split(".")[1] if op_name.startswith("aten.") else op_name
    return any(base.startswith(m) or m in base for m in MATMUL_OPS)


# ops whose output shape is the data's (a per-expert loop's routing: the experts hit, each one's tokens): Dynamo
# breaks its graph at each (torch._dynamo.config.capture_dynamic_output_shape_ops is off by default) and the rest
# of the block runs as eager Python around the pieces
# (nonzero_static, whose size is given, does not)
DATA_DEPENDENT_SHAPE_OPS = frozenset({"nonzero", "masked_select", "_unique", "_unique2", "unique_dim",
                                      "unique_consecutive", "unique_dim_consecutive"})


def breaks_graph(op_name: str) -> bool:
    """Whether torch.compile breaks its graph at this traced op (DATA_DEPENDENT_SHAPE_OPS)."""
    return (op_name.split(".")[1] if op_name.startswith("aten.") else op_name) in DATA_DEPENDENT_SHAPE_OPS


def classify(op_name: str, out_shapes: Sequence[Sequence[int]] = (), flops: float = 0.0,
             broadcast: bool = False, strided: bool = False, fp32_broadcast: bool = False,
             fp32_out: bool = False, depthwise: bool = False) -> int:
    """Kernel class code (CLASS_CODE) of one traced op (see the module docstring); `broadcast`: the
    tracer saw an elementwise op with an input broadcast to its output; `strided`: one that reads an
    input with gaps or laid out unlike its output, or writes into a slice; `fp32_broadcast`: a broadcast
    in fp32 throughout, along leading or trailing dimensions only; `fp32_out`: its output is fp32 (a GEMM
    then ran on fp32 inputs); `depthwise`: a convolution with one input channel a group."""
    base = _base(op_name)
    if depthwise and base in ("convolution", "convolution_backward"):
        return CLASS_CODE["conv_depthwise"]
    if "attention" in base or "scaled_dot_product" in base:
        return CLASS_CODE["attention_bwd" if "backward" in base else "attention_fwd"]
    if base in _GEMM_BASES:
        if fp32_out:
            return CLASS_CODE["gemm_fp32"]
        return CLASS_CODE[{1: "gemm_unaligned", 2: "gemm_align2", 4: "gemm_align2"}.get(_alignment(out_shapes, flops),
                                                                                       "gemm")]
    if base == "_grouped_mm":
        return CLASS_CODE["gemm_grouped"]
    if is_matmul(op_name):
        return CLASS_CODE["gemm"]
    cls = _BY_BASE.get(base, "other")
    if cls.startswith("rms_norm") and out_shapes and out_shapes[0] and int(out_shapes[0][-1]) <= NARROW_NORM:
        cls = cls.replace("rms_norm", "rms_norm_narrow")
    elif cls == "other" and broadcast and base.rstrip("_") in _BROADCASTING:
        cls = "broadcast_binary_fp32" if fp32_broadcast else "broadcast_binary"
    elif cls in ("other", "cast") and strided:
        cls = "strided"
    return CLASS_CODE[cls]


def classify_node(attrs: dict) -> int:
    """`classify` of a traced OpGraph node's attributes."""
    dtypes = attrs.get("out_dtypes") or ()
    return classify(attrs.get("op", ""), attrs.get("out_shapes", ()), attrs.get("flops", 0.0),
                    attrs.get("broadcast", False), attrs.get("strided", False),
                    attrs.get("fp32_broadcast", False), bool(dtypes) and dtypes[0] == "float32",
                    bool(attrs.get("depthwise")))


def _alignment(out_shapes: Sequence[Sequence[int]], flops: float) -> int:
    """The largest of 1, 2, 4, 8 elements dividing M, N and K of a GEMM out [..., M, N] of F = 2 * batch * M *
    N * K FLOPs (8: aligned)."""
    if not out_shapes or len(out_shapes[0]) < 2 or flops <= 0:
        return 8
    *batch, m, n = (int(d) for d in out_shapes[0])
    k = flops / (2.0 * math.prod(batch) * m * n)
    if abs(k - round(k)) > 1e-6:
        return 1
    return next(a for a in (8, 4, 2, 1) if m % a == 0 and n % a == 0 and round(k) % a == 0)


# Ops that return a tensor sharing their input's storage without the view flag: no kernel runs, but the
# tracer records their bytes like any op's (8.5 ms of phantom traffic per step of a 1.3B llama).
ALIAS_OPS = ("_unsafe_view",)


# Per-op selective checkpointing (torchtitan's "op" policy, autoparallel.trainer.recompute): the outputs
# of these ops are saved, every other op of the block is recomputed in backward.
OP_SAC_SAVED = ("mm", "addmm", "bmm", "_grouped_mm", "_scaled_dot_product_flash_attention",
                "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
                "_scaled_dot_product_flash_attention_for_cpu", "reduce_scatter_tensor",
                "_scaled_mm")  # FP8 linears' GEMM: saved like the mm it replaces


def saved_under_op_sac(op_name: str) -> bool:
    """Whether per-op selective checkpointing saves this op's outputs (OP_SAC_SAVED)."""
    return _base(op_name) in OP_SAC_SAVED


# Which per-op selective checkpointing a runtime runs: "trainer", AutoParallelTrainer's (OP_SAC_SAVED), or
# "torchtitan", torchtitan's "op" policy (its llama3 parallelize `_save_list`, 2024-12 to 2025-06): it
# counts the aten.mm calls of each block forward (a fresh count per checkpointed call) and saves the 1st,
# 3rd, 5th ... of them, recomputing the others; fused attention and reduce-scatters are saved, the rest
# (addmm and bmm included) recomputed. A llama block recomputes wk, wo and w3: 37% of its forward GEMM FLOPs.
OP_SAC_POLICIES = ("trainer", "torchtitan")
TORCHTITAN_SAC_SAVED = ("_scaled_dot_product_flash_attention", "_scaled_dot_product_efficient_attention",
                        "_scaled_dot_product_cudnn_attention", "_scaled_dot_product_flash_attention_for_cpu",
                        "reduce_scatter_tensor", "max")


def op_sac_keep(op_names: Sequence[str], policy: str = "trainer") -> np.ndarray:
    """bool per forward op of one block, in trace order: whether `policy`'s per-op selective checkpointing
    saves its outputs (OP_SAC_POLICIES)."""
    if policy == "trainer":
        return np.array([saved_under_op_sac(n) for n in op_names], dtype=bool)
    if policy != "torchtitan":
        raise ValueError(f"op_sac policy {policy!r} is not one of {', '.join(OP_SAC_POLICIES)}")
    keep, mm = [], 0
    for n in op_names:
        base = _base(n)
        mm += base == "mm"
        keep.append(mm % 2 == 1 if base == "mm" else base in TORCHTITAN_SAC_SAVED)
    return np.array(keep, dtype=bool)


def moved_bytes(attrs: dict) -> float:
    """Bytes a traced op moves through device memory: its inputs read + outputs written (0 for aliases).
    `_safe_softmax` (scaled_dot_product_attention's math path, where neither flash nor memory-efficient
    attention takes the heads: Falcon's multi-query broadcast) is one op on the meta device and four kernels on
    CUDA: softmax (reads and writes s bytes an element), isneginf (reads s, writes a 1-byte flag), all along the
    row (reads the flags) and where (reads s, writes s): 5 s + 2 bytes an element where the trace counts 2 s.
    On an H200 Falcon 7B's 16 calls (fp32, 1.19e9 elements each) moved those bytes in 138 ms, 0.63 of the
    bandwidth: the op stays in the generic class (memory_bound), not the softmax kernel's, whose calibrated
    rate is that of calibrate's short rows (raw/trainer_sweep_families11_s47.jsonl)."""
    base = _base(attrs.get("op", ""))
    if base in ALIAS_OPS:
        return 0.0
    moved = float(attrs.get("bytes_read", 0) + attrs.get("bytes_written", 0))
    if base == "_safe_softmax" and attrs.get("out_shapes"):  # its output: `bytes_written`, s bytes an element
        moved += 3 * float(attrs.get("bytes_written", 0)) + 2 * math.prod(attrs["out_shapes"][0])
    return moved


def copy_bytes_of(op_name: str, out_bytes: float) -> float:
    """Bytes an op copies into its output before its kernel runs (baddbmm's additive input)."""
    return out_bytes if _base(op_name) in ("baddbmm", "addbmm") else 0.0


def calibrated(profile: HardwareProfile, key: str, default: float) -> float:
    """A measured value from the profile's calibration section, else `default`."""
    value = profile.calibration.get(key) if profile.calibration else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else default


def _calibrated_entry(profile: HardwareProfile, table: str, key: str, default: float) -> float:
    """A measured value from a table of the profile's calibration section (calibration[table][key]), else
    `default`."""
    values = profile.calibration.get(table) if profile.calibration else None
    value = values.get(key) if isinstance(values, dict) else None
    return float(value) if isinstance(value, (int, float)) and value > 0 else default


def gathered_per_row(out_shape: tuple[int, ...], out_bytes: float, bytes_read: float) -> float:
    """Source rows an accumulating index_put (the backward of a row gather `w[idx]`) adds into each of its R
    destination rows on average, N / R, from the op's traced sizes: it reads its destination (R rows), the N
    gathered rows and their int64 indices."""
    rows = int(out_shape[0]) if out_shape else 0
    if rows <= 0 or out_bytes <= 0:
        return 0.0
    row_bytes = out_bytes / rows
    return max(bytes_read - out_bytes, 0.0) / (row_bytes + 8) / rows


def index_put_bytes(out_shape: tuple[int, ...], out_bytes: float, bytes_read: float) -> float:
    """What an accumulating index_put (the backward of a row gather) moves in index_put_terms' convention
    (benchmarks/index_backward.py, which the terms were fitted to: its N source rows read and its R destination
    rows written, at 2 bytes an element, and 8 bytes an index), from the op's traced sizes. The trace also counts
    the zero-filled destination as read, which that convention leaves out. And elements, not bytes: at the
    fitted 18% of the bandwidth the kernel is not memory-bound, so an fp32 row takes the time of a bf16 one of
    the same length (the profiled steps of three MoE families, whose expert outputs are scattered back in fp32,
    spent 4.1 / 13.2 / 3.0 ms in the op where its traced bytes priced 11.2 / 40.0 / 8.3, these 5.3 / 22.6 / 3.9:
    benchmarks/op_times.py; docs/trainer_sweep_notes.md, "Thirty-third session"). Timed since (s104,
    `benchmarks/index_backward.py check --raw benchmarks/results/raw/index_backward_fp32_h200_s104.json`): the
    benchmark's 42 shapes in fp32 run 0.70-1.15x their bf16 time (median 0.90: fp32 atomics are native), priced
    so 12.4% mean |error| (bf16's: 13.2%), by bytes 48.2%."""
    rows = int(out_shape[0]) if out_shape else 0
    numel = float(np.prod(out_shape)) if out_shape else 0.0
    if rows <= 0 or numel <= 0 or out_bytes <= 0:
        return 0.0
    n = gathered_per_row(out_shape, out_bytes, bytes_read) * rows
    source = max(bytes_read - out_bytes - 8.0 * n, 0.0)
    return (source + out_bytes) * 2.0 / (out_bytes / numel) + 8.0 * n


def index_put_times(moved: np.ndarray, per_row: np.ndarray, profile: HardwareProfile) -> np.ndarray | None:
    """GPU seconds of accumulating index_puts that move `moved` bytes (index_put_bytes) and add `per_row` source rows into each
    destination row, from calibration.index_put_terms {fraction, duplicate_us, fixed_us}; None where the
    profile has none. CUDA's kernel sorts the indices and gives each destination row to one warp, which adds
    that row's duplicates one after another, so an expert table gathered per routed token (32 rows, 16384
    token-slots) takes the time of its duplicates, not of its bytes (benchmarks/index_backward.py)."""
    terms = profile.calibration.get("index_put_terms") if profile.calibration else None
    if not isinstance(terms, dict) or not all(isinstance(terms.get(k), (int, float)) and terms[k] > 0
                                              for k in ("fraction", "duplicate_us", "fixed_us")):
        return None
    return (moved / (profile.memory_bandwidth * terms["fraction"]) + per_row * terms["duplicate_us"] * 1e-6
            + terms["fixed_us"] * 1e-6)


def stream_gap_seconds(profile: HardwareProfile, compiled: bool) -> float:
    """The GPU's idle time between two kernels of a GPU-paced step beyond the kernel_overhead_us every kernel is
    charged [s]: calibration.stream_gap_us, a pair (eager, compiled), else 0. Kernels issued one by one from the
    host leave the stream idle longer than a CUDA graph's replay does, where calibrate timed them
    (benchmarks/stream_gaps.py: on an H200 3.2 us a kernel eager, 4.3 compiled, against 1.05 replayed)."""
    pair = profile.calibration.get("stream_gap_us") if profile.calibration else None
    if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and x >= 0 for x in pair):
        return float(pair[compiled]) * 1e-6
    return 0.0


def memory_fraction(profile: HardwareProfile, cls: str) -> float:
    """Achieved fraction of memory bandwidth of a kernel class (calibrated, else memory_bound)."""
    return _calibrated_entry(profile, "memory_fraction", cls, profile.efficiency.memory_bound)


def gemm_efficiency(flops: np.ndarray | float, profile: HardwareProfile) -> np.ndarray | float:
    """e_gemm(F) = gemm_max * F / (F + gemm_half_flops)   (dimensionless, F in FLOPs)."""
    eff = profile.efficiency
    return eff.gemm_max * flops / (flops + eff.gemm_half_flops)


def _class_tables(profile: HardwareProfile, dtype: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(curve maximum, curve half-size [FLOPs], bandwidth fraction) per class code; the maxima are fractions of
    the compute dtype's peak."""
    eff = profile.efficiency
    peak_max = np.full(len(CLASSES), eff.gemm_max)
    half = np.full(len(CLASSES), eff.gemm_half_flops)
    peak_max[CLASS_CODE["gemm_unaligned"]] = calibrated(profile, "gemm_unaligned_max", eff.gemm_max)
    peak_max[CLASS_CODE["gemm_align2"]] = calibrated(profile, "gemm_align2_max", peak_max[CLASS_CODE["gemm_unaligned"]])
    peak_max[CLASS_CODE["gemm_grouped"]] = calibrated(profile, "gemm_grouped_max", eff.gemm_max)
    # an fp32 GEMM's calibrated fraction is of the fp32 peak, rescaled to the compute dtype's; in an fp32 model
    # every GEMM is one, at the plain gemm curve
    peak, fp32_peak = profile.peak(dtype), profile.peak_flops.get("fp32", profile.peak(dtype))
    peak_max[CLASS_CODE["gemm_fp32"]] = (
        _calibrated_entry(profile, "gemm_best_fraction_by_dtype", "fp32", eff.gemm_max) * fp32_peak / peak
        if fp32_peak != peak else eff.gemm_max)
    # its half-size in proportion: the curve's fixed time, half / (peak x max), is the kernel's (launch, the
    # last wave), not the units'. At bf16's half-size a 134 MFLOP fp32 bmm took 39 us where an H200 ran Qwen3-Next's
    # DeltaNet fallback's 2330 small fp32 bmms in 13.7 us each (s96's profiled step)
    half[CLASS_CODE["gemm_fp32"]] = eff.gemm_half_flops * peak_max[CLASS_CODE["gemm_fp32"]] / eff.gemm_max
    half[CLASS_CODE["gemm_grouped"]] = calibrated(profile, "gemm_grouped_half_flops", eff.gemm_half_flops)
    for phase in ("fwd", "bwd"):
        code = CLASS_CODE[f"attention_{phase}"]
        peak_max[code] = calibrated(profile, f"attention_{phase}_max", eff.gemm_max)
        half[code] = calibrated(profile, f"attention_{phase}_half_flops", eff.gemm_half_flops)
    mem = np.full(len(CLASSES), eff.memory_bound)
    for cls in MEMORY_CLASSES:
        mem[CLASS_CODE[cls]] = memory_fraction(profile, cls)
    return peak_max, half, mem


def op_times(flops: np.ndarray, bytes_moved: np.ndarray, matmul: np.ndarray, profile: HardwareProfile,
             dtype: str, op_class: np.ndarray | None = None, copy_bytes: np.ndarray | None = None,
             groups: np.ndarray | None = None) -> np.ndarray:
    """Vectorized roofline time per op [s]; see the module docstring for the formula. Without
    `op_class`, matmuls use the gemm curve and other ops memory_bound (the generic model). `groups`:
    the number of groups of each grouped GEMM (1 elsewhere); its efficiency is that of one group."""
    peak = profile.peak(dtype)
    eff = profile.efficiency
    bw = profile.memory_bandwidth
    if op_class is None:
        curve_max, mem = np.full(len(flops), eff.gemm_max), np.full(len(flops), eff.memory_bound)
        half = np.full(len(flops), eff.gemm_half_flops)
    else:
        maxes, halves, fracs = _class_tables(profile, dtype)
        curve_max, half, mem = maxes[op_class], halves[op_class], fracs[op_class]
    with np.errstate(divide="ignore", invalid="ignore"):
        per_group = groups is not None and op_class is not None
        f = np.maximum(np.where(op_class == CLASS_CODE["gemm_grouped"], flops / np.maximum(groups, 1), flops)
                       if per_group else flops, 1.0)
        e = np.where(matmul, curve_max * f / (f + half), eff.gemm_max)
        t_compute = np.where(flops > 0, flops / (peak * e), 0.0)
    moved = bytes_moved if copy_bytes is None else bytes_moved + copy_bytes
    t_memory = moved / (bw * mem)
    launch = np.where((flops > 0) | (bytes_moved > 0), eff.kernel_overhead_s, 0.0)
    t = np.maximum(t_compute, t_memory) + launch
    if copy_bytes is not None and np.any(copy_bytes > 0):
        frac = memory_fraction(profile, "broadcast_copy")
        t = t + np.where(copy_bytes > 0, copy_bytes / (bw * frac) + eff.kernel_overhead_s, 0.0)
    return t


ATTENTION_TERMS = ("flop_max", "score_ps", "row_bytes", "fixed_us")
# FLOPs flop_counter counts per score element and head dimension: forward 2 products of 2 FLOPs each,
# backward 2.5x that (the scores recomputed, four more products)
ATTENTION_FLOPS_PER_SCORE = {"fwd": 4.0, "bwd": 10.0}


# Which causal kernel SDPA runs: "default", the one torch picks where the calibration ran (cuDNN's on Hopper
# with torch >= 2.9 and its bundled cuDNN >= 9.15: what the trainer runs), or "flash", SDPA's flash backend
# (FlashAttention-2), which torch picked on Hopper before (cuDNN opt-in from 2.5.1, pytorch#138522) and on
# every earlier part: 1.8-1.9x the cuDNN kernel's time at 8192 tokens on an H200.
ATTENTION_KERNELS = ("default", "flash")


def attention_terms(profile: HardwareProfile, phase: str, masked: bool = False, kernel: str = "default"
                    ) -> tuple[float, float, float, float] | None:
    """(flop_max, seconds per score element, bytes per query element, fixed seconds) of the fused attention
    kernels of `phase`, where the calibration has them (module docstring), else None. `masked`: the kernels
    given an additive mask instead of is_causal (calibration.attention_masked_{phase}_terms); a profile with
    only the causal terms prices them with the FLOP and score terms doubled: a kernel that cannot tell the mask
    is causal computes every score, where the causal one (whose fit counts F as full) skips half. `kernel`
    "flash": the causal kernel's terms of SDPA's flash backend (calibration.attention_flash_{phase}_terms),
    the default kernel's where the calibration has none."""
    cal = profile.calibration or {}
    value = cal.get(f"attention_{phase}_terms")
    flash = cal.get(f"attention_flash_{phase}_terms") if kernel == "flash" and not masked else None
    if isinstance(flash, list) and len(flash) == len(ATTENTION_TERMS):
        value = flash
    own = cal.get(f"attention_masked_{phase}_terms") if masked else None
    if isinstance(own, list) and len(own) == len(ATTENTION_TERMS):
        value, masked = own, False
    if not (isinstance(value, list) and len(value) == len(ATTENTION_TERMS)):
        return None
    flop_max, score_ps, row_bytes, fixed_us = (float(x) for x in value)
    full = 2.0 if masked else 1.0
    return flop_max / full, score_ps * full * 1e-12, row_bytes, fixed_us * 1e-6


def padded_head_dim(head_dim: int, profile: HardwareProfile, kernel: str = "default") -> int:
    """The head dimension a fused attention kernel computes with: `head_dim` rounded up to the kernel's tile
    (calibration.attention_head_dim_tile, attention_flash_head_dim_tile for `kernel` "flash"); `head_dim`
    itself where the profile names no tile. An H200's default kernel (cuDNN's sm90 flash fprop/bprop) ran
    heads of 80 and 96 in its 128-wide kernels, within 8% of 128's time, and FlashAttention-2 (templates every 32)
    ran 80 as 96 (benchmarks/results/raw/attention_head_dims_h200_s94.json: the kernel names and times)."""
    cal = profile.calibration or {}
    tile = cal.get("attention_flash_head_dim_tile" if kernel == "flash" else "attention_head_dim_tile")
    if not isinstance(tile, int) or tile <= 0:
        return head_dim
    return -(-head_dim // tile) * tile


def attention_tile_scale(profile: HardwareProfile, padded: int, phase: str) -> float:
    """The default causal kernel's FLOP rate at a padded head dimension beyond those its terms were fitted at,
    relative to the terms (calibration.attention_tile_flop_scale {tile: [fwd, bwd]}; a tile past the largest
    listed takes the largest's); 1 elsewhere. On an H200 the 192- and 256-wide kernels ran their FLOPs at
    0.83 / 0.79 of the fitted rate forward and 0.51 / 0.60 backward (s94, five shapes each)."""
    table = (profile.calibration or {}).get("attention_tile_flop_scale")
    if not isinstance(table, dict) or not table:
        return 1.0
    fitted = [v for k, v in sorted((int(k), v) for k, v in table.items()) if k <= padded]
    pair = fitted[-1] if fitted else None
    return float(pair[phase == "bwd"]) if isinstance(pair, list) and len(pair) == 2 else 1.0


def attention_times(flops: np.ndarray, phase: str, seq: int, head_dim: int, profile: HardwareProfile,
                    dtype: str, masked: np.ndarray | None = None, kernel: str = "default") -> np.ndarray | None:
    """Seconds of fused attention ops of `phase` that run `flops` (flop_counter FLOPs, on one rank) over
    sequences of `seq` keys with heads of `head_dim`: the four-term sum of the module docstring, its score
    and query elements read off the FLOPs (S2 = F / (k D), E = S2 D / S_k) with the FLOPs and query elements
    of the head dimension the kernel pads to (`padded_head_dim`), the FLOP term at the tile's own rate
    (`attention_tile_scale`, the default kernel); `masked` (bool per op): the kernels given a mask (padded as
    the default kernel); `kernel`: the causal kernel (ATTENTION_KERNELS, `attention_terms`). None without the
    terms."""
    causal = attention_terms(profile, phase, kernel=kernel)
    if causal is None or seq <= 0 or head_dim <= 0:
        return None
    scores = flops / (ATTENTION_FLOPS_PER_SCORE[phase] * head_dim)
    masked = np.zeros_like(flops, dtype=bool) if masked is None else masked
    out = np.zeros_like(flops, dtype=float)
    # the masked kernels' own terms were fitted up to 256-wide heads (attention_timing.py MASKED_EXTRA): no scale
    for sel, terms, which, scaled in ((~masked, causal, kernel, kernel == "default"),
                                      (masked, attention_terms(profile, phase, masked=True), "default", False)):
        flop_max, score_s, row_bytes, fixed_s = terms
        padded = padded_head_dim(head_dim, profile, which)
        scale = attention_tile_scale(profile, padded, phase) if scaled else 1.0
        padded_flops = scores * ATTENTION_FLOPS_PER_SCORE[phase] * padded
        out = np.where(sel & (flops > 0), padded_flops / (profile.peak(dtype) * flop_max * scale)
                       + scores * score_s + scores * padded / seq * row_bytes / profile.memory_bandwidth + fixed_s,
                       out)
    return out


def host_seconds_per_op(profile: HardwareProfile, phase: str, expert: bool = False) -> float:
    """Host seconds to issue one eager op in a forward ("fwd", also recompute) or backward ("bwd") phase:
    the calibration's per-phase pair host_us_per_op[_moe]_fwd_bwd, else its blend host_us_per_op[_moe];
    0 for an uncalibrated profile (no floor). Backward ops cost more (the autograd engine, hooks)."""
    key = "host_us_per_op_moe" if expert else "host_us_per_op"
    pair = profile.calibration.get(key + "_fwd_bwd") if profile.calibration else None
    if isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, (int, float)) and x > 0 for x in pair):
        return float(pair[phase == "bwd"]) * 1e-6
    if expert and key not in (profile.calibration or {}):
        return host_seconds_per_op(profile, phase)
    return calibrated(profile, key, 0.0) * 1e-6


def compiled_times(times: np.ndarray, matmul: np.ndarray, moved: np.ndarray, profile: HardwareProfile,
                   fused_share: float | None = None) -> np.ndarray:
    """Per-op times under torch.compile; GEMMs and attention run the same library kernels. Inductor fuses
    the pointwise and reduction ops between them into few kernels. Where the block's compiled graphs were
    analysed (`fused_share`: the bytes its fused kernels move over the bytes its traced memory-bound ops move
    eager, autoparallel.compiled_saved.fused_bytes) and the profile has calibration.compiled_fused_fraction,
    each memory-bound op moves `moved` x fused_share bytes at that fraction of the bandwidth: a block whose
    norm and activation are one eager kernel each (LayerNorm, GELU) keeps most of its bytes, a block of fp32
    RMSNorm chains sheds most of them. Elsewhere (the compiled loss, a block the partitioner could not take)
    the non-matrix ops keep calibration.compiled_memory_fraction of their eager time. Their host floor is
    `compiled_host_floor`."""
    rate = calibrated(profile, "compiled_fused_fraction", 0.0) * profile.memory_bandwidth
    if fused_share is not None and rate > 0:
        return np.where(matmul, times, moved * fused_share / rate)
    frac = calibrated(profile, "compiled_memory_fraction", 1.0)
    return np.where(matmul, times, times * frac)


# A compiled block's forward call costs the host more than its backward's: at 32 tokens a row the forwards
# of six families took 1.52 ms on average beyond their FSDP2 per-tensor work, the backwards 1.01 ms
# (benchmarks/results/raw/host_mix_compiled_s36.jsonl). The calibrated per-call term is their mean; each
# phase takes its share, so the probes' steps (forward plus backward) fit it unchanged.
COMPILED_CALL_SHARE = {"fwd": 1.2, "bwd": 0.8}


def compiled_host_floor(per_call_s: float, phase: str, per_launch_s: float = 0.0, launches: int = 0) -> float:
    """Host time of one phase of a compiled block [s]: its graph call's guards and wrappers (cost_models.host
    host_us_per_compiled_call), the same for any op count (compiled, Gemma 3's blocks of 121 traced forward ops
    took the host about as long as a llama's of 63), and per kernel it launches (host_us_per_compiled_launch,
    graph.Launches) Inductor's generated launcher and the buffers around it: a 350M GPT block's compiled backward
    launched 42 kernels at 16384 tokens a micro-batch and 25 at 32, and took 0.61 ms more host (s77). Compiled
    steps of small models are host-bound too: the GPT's left its GPU idle 17-27 ms."""
    return per_call_s * COMPILED_CALL_SHARE[phase] + per_launch_s * launches


def host_floor(n_ops: float, profile: HardwareProfile, phase: str = "fwd", expert: np.ndarray | None = None,
               dynamic_gemm: np.ndarray | None = None, per_op_extra_s: float = 0.0, extra_s: float = 0.0,
               extra_ops: float = 0.0) -> float:
    """Host time of an eager phase of `n_ops` ops [s] (module docstring): n_ops * (host_seconds_per_op +
    per_op_extra_s) + extra_s, with the MoE rate in phases with expert groups. per_op_extra_s and
    extra_s are the trainer's own host work (cost_models.host: DTensor and per-op checkpointing dispatch
    per op; FSDP hooks and checkpoint regions per phase). Each `dynamic_gemm` (an expert GEMM of a
    per-expert loop, whose token count is data-dependent) pays host_us_per_new_gemm_shape: the BLAS
    library picks a kernel for a new problem size on the host (the regime of a run whose heuristics cache
    has not yet seen the counts; an upper bound for long runs). Grouped expert GEMMs (torch._grouped_mm)
    have static shapes and pay nothing extra. `extra_ops`: kernels the traced graph does not hold (the
    eager FP8 casts, FP8_EAGER_KERNELS), issued like any op."""
    moe = expert is not None and len(expert) == n_ops and bool(expert.any())
    host = host_seconds_per_op(profile, phase, moe)
    floor = (host + per_op_extra_s) * (n_ops + extra_ops) + extra_s
    if moe and dynamic_gemm is not None:
        extra = calibrated(profile, "host_us_per_new_gemm_shape", host * 1e6) * 1e-6 - host
        floor += max(extra, 0.0) * float(np.count_nonzero(dynamic_gemm))
    return floor


def stretch_to(times: np.ndarray, floor: float) -> np.ndarray:
    """Per-op times stretched so that they sum to at least `floor` (the host sets the pace)."""
    total = float(times.sum())
    if floor <= total or total <= 0:
        return times
    return times * (floor / total)


# FP8 linears (torchao float8 training; autoparallel.trainer.low_precision). Each FP8 GEMM casts its two
# high-precision (bf16) operands: an amax pass, then a scaled cast to float8. Bytes per operand element,
# counted from torchao 0.18's float8 code (float8_utils.tensor_to_amax, _ToFloat8ConstrFunc):
#   eager     abs (r2 w2) + max (r2) + to fp32 (r2 w4) + mul by scale (r4 w4) + clamp (r4 w4) + to fp8 (r4 w1) = 33
#   compiled  one fused amax (r2) + one fused scale-and-cast (r2 w1) = 5
# Eager, every operand of every GEMM is cast from high precision, tensorwise too: torchao's
# matmul_with_hp_or_float8_args saves the bf16 input and weight and its backward casts grad_output twice (for
# grad_input and for grad_weight) and input and weight again; _scaled_mm takes its first operand row-major
# and its second column-major, so preprocess_addmm copies three of the six (grad_input's weight, both of
# grad_weight's: r1 w1 = 2 each): (6 x 33 + 3 x 2) / 6 = 34 per operand element, either recipe. (Counted as
# 17.5 for tensorwise, one cast per tensor, until Llama 3 8B's widths ran eager FP8 218 ms a step slower than
# eager bf16 where the model said 30: docs/low_precision.md.) Compiled, Inductor fuses each amax and cast and
# computes a tensor's tensorwise scale once: 3 casts + 3 transposed writes over 6 operands, (5 + 2) / 2 = 3.5;
# rowwise scales along each GEMM's reduction axis, so every operand is cast: 5.
FP8_CAST_BYTES = {("tensorwise", False): 34.0, ("tensorwise", True): 3.5,
                  ("rowwise", False): 34.0, ("rowwise", True): 5.0}
# Extra eager kernels per FP8 GEMM, which the host issues (the host floor): ~10 per cast (abs, max, four
# scale ops, to, mul, clamp, to) and 1 per layout copy: (6 casts + 3 copies) / 3 GEMMs = 21, either recipe.
# Compiled blocks fuse them into their graph.
FP8_EAGER_KERNELS = {"tensorwise": 21.0, "rowwise": 21.0}


def fp8_gemm_curve(profile: HardwareProfile, recipe: str) -> tuple[float, float]:
    """(curve maximum, half-size FLOPs) of FP8 GEMMs: calibration.gemm_fp8_max (rowwise:
    gemm_fp8_rowwise_max), by default the bf16 curve's maximum (the same fraction of the doubled peak)
    until `calibrate` or benchmarks/fp8_h200.py measure it; the half size scales with the peak
    (e = F / (F + P t0): the fixed cost t0 of a GEMM amortizes over P t0 FLOPs, P the fp8 peak)."""
    eff = profile.efficiency
    fp8_max = calibrated(profile, "gemm_fp8_max", eff.gemm_max)
    if recipe == "rowwise":
        fp8_max = calibrated(profile, "gemm_fp8_rowwise_max", fp8_max)
    half = calibrated(profile, "gemm_fp8_half_flops", eff.gemm_half_flops * profile.peak("fp8") / profile.peak("bf16"))
    return fp8_max, half


def fp8_gemm_times(flops: np.ndarray, cast_elements: np.ndarray, profile: HardwareProfile, recipe: str,
                   compiled: bool) -> np.ndarray:
    """Time of FP8 GEMMs [s]: F / (P_fp8 e_fp8(F)) on the FP8 curve (fp8_gemm_curve), plus the cast
    passes over their operands, cast_elements * FP8_CAST_BYTES / (BW m_cast) and a launch per kernel."""
    peak = profile.peak("fp8")
    curve_max, half = fp8_gemm_curve(profile, recipe)
    f = np.maximum(flops, 1.0)
    t_gemm = np.where(flops > 0, flops / (peak * curve_max * f / (f + half)), 0.0)
    bw = profile.memory_bandwidth * memory_fraction(profile, "cast")
    t_cast = cast_elements * FP8_CAST_BYTES[recipe, compiled] / bw
    launches = (1.0 + (0.0 if compiled else FP8_EAGER_KERNELS[recipe])) * profile.efficiency.kernel_overhead_s
    return t_gemm + t_cast + launches


# FSDP2 mixed precision, bytes per unsharded local parameter and per micro-batch (d = FSDP group size):
# an unshard casts the fp32 shard into the bf16 all-gather buffer (4/d read + 2/d written) and copies the
# gathered bf16 parameters out (2 + 2); a gradient reduction concatenates the bf16 gradients into the
# fp32 reduce-scatter input (2 + 4) and adds the reduced shard into the fp32 gradient (12/d).
FSDP_GATHER_BYTES = (6.0, 4.0)       # (per 1/d, fixed)
FSDP_REDUCE_BYTES = (12.0, 6.0)
# Gradients kept over micro-batches without a reduction (ZeRO 0/1 before the last, every backward but the
# last under a pipeline), with a reduce dtype wider than the parameters' (the trainer's bf16 / fp32): FSDP2
# upcasts the first one into an fp32 accumulator (FSDPParam.to_accumulated_grad_if_needed: 2 read + 4
# written), adds each later one into it (accumulate_unsharded_grad_if_needed: 4 + 2 read, 4 written) and
# reduces from fp32 (4 + 4 where a bf16 gradient's cast is 2 + 4). Without the upcast (equal dtypes)
# autograd adds each later gradient into the p-byte one (3 p).
FSDP_ACCUMULATE_BYTES = (6.0, 10.0, 2.0)  # (upcast, add, wider reduce input)


def fsdp_accumulate_bytes(micro_batches: int, reductions: int, param_bytes: int, reduce_bytes: int) -> float:
    """Bytes per unsharded local parameter that keeping gradients over micro-batches moves in a step
    (FSDP_ACCUMULATE_BYTES): M micro-batches in M_r reduction windows; a window of one micro-batch
    reduces its gradient as it comes.

        M_r (6 + 2) + (M - M_r) 10      reduce dtype wider than the parameters' (FSDP2's fp32 accumulator)
        (M - M_r) 3 p                   otherwise (autograd's accumulation in place)
    """
    kept = micro_batches - reductions
    if kept <= 0:
        return 0.0
    upcast, add, reduce_input = FSDP_ACCUMULATE_BYTES
    if reduce_bytes > param_bytes:
        return reductions * (upcast + reduce_input) + kept * add
    return kept * 3.0 * param_bytes


def fsdp_update_time(optimizer_params: float, d: int, schedule: DpSchedule, micro_batches: int,
                     profile: HardwareProfile, param_bytes: int = 2, reduce_bytes: int = 4,
                     clip: bool = False) -> float:
    """Optimizer step + FSDP2's per-micro-batch parameter and gradient copies, per unsharded local
    parameter [s] (AutoParallelTrainer's runtime; `update_time` is Megatron-LM's):

        optimizer_params * (28 + 12 clip) / m_adamw + (M_g * gather + M_r * reduce) / m_copy + accumulate / m_acc
                                                                                                 bytes, / BW
        gather = 6/d + 4, reduce = 12/d + 6   (FSDP_*_BYTES), accumulate = fsdp_accumulate_bytes
        M_g, M_r = the schedule's unshards and reductions (comm.trainer_dp_schedule: without a pipeline M
        unshards, 2M under ZeRO-3, and M reductions under ZeRO 2/3, else 1)
        m_adamw = calibration.memory_fraction.adamw, m_copy = calibration.fsdp_copy_fraction,
        m_acc = calibration.fsdp_accumulate_fraction (FSDP2's upcast and add are unvectorized casting
        kernels, about half the bandwidth; m_copy where the profile has none)

    The fused Adam(W) updates the fp32 shard in place (the bf16 copy is made by the next unshard) and
    the gradients are freed by zero_grad(set_to_none=True), so there is neither a master-weight copy nor
    a buffer to zero. Both fractions are read from the trainer's own kernels: its multi-tensor AdamW
    kernel runs below plain copy bandwidth (0.71 of an H200's against memory_bound's 0.83, in every
    model profiled), and the copies' fraction covers the casts, concatenations and one-rank collectives
    of an unshard and a reduction together (benchmarks/trainer_sweep.py `update-rates`).

    clip: the trainer's max_grad_norm, CLIP_BYTES more per gradient entry the optimizer holds (the
    gradients are sharded as the optimizer's parameters are), at the fused AdamW's fraction: torch's foreach norm
    and scaling run on the same multi-tensor kernel machinery. Held out on one H200 (s117, the 1.3B llama's
    profiled steps): the clip's multi-tensor kernels took 4.33 ms eager and 4.36 ms compiled against 4.56 ms
    priced (+5%). Its scalar all-reduces (one per sharded mesh dimension, one over pp) are latencies, left out."""
    bw = profile.memory_bandwidth
    frac = calibrated(profile, "fsdp_copy_fraction", memory_fraction(profile, "cast"))
    copies = (schedule.unshards * (FSDP_GATHER_BYTES[0] / d + FSDP_GATHER_BYTES[1])
              + schedule.reductions * (FSDP_REDUCE_BYTES[0] / d + FSDP_REDUCE_BYTES[1]))
    accumulate = fsdp_accumulate_bytes(micro_batches, schedule.reductions, param_bytes, reduce_bytes)
    update_bytes = ADAM_BYTES + (CLIP_BYTES if clip else 0)
    return (optimizer_params * update_bytes / (bw * memory_fraction(profile, "adamw")) + copies / (bw * frac)
            + accumulate / (bw * calibrated(profile, "fsdp_accumulate_fraction", frac)))


def update_time(params: float, accumulate_params: float, micro_batches: int, param_bytes: int, grad_bytes: int,
                profile: HardwareProfile) -> float:
    """Optimizer step + gradient accumulation per step [s] (module docstring). `params` are the local
    parameters the optimizer updates, `accumulate_params` those whose gradients each micro-batch adds."""
    bw = profile.memory_bandwidth
    m_gen = profile.efficiency.memory_bound
    m_cast = memory_fraction(profile, "cast")
    per_param = ADAM_BYTES / m_gen + grad_bytes / m_gen
    if param_bytes < 4:  # a 16-bit working copy of the fp32 master weights is rewritten every step
        per_param += (4 + param_bytes) / m_cast
    m_acc = m_cast if param_bytes != grad_bytes else m_gen
    return (params * per_param + micro_batches * accumulate_params * (param_bytes + 2 * grad_bytes) / m_acc) / bw
