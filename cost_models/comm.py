"""Collective communication times, alpha-beta model (ring algorithms, as NCCL/RCCL/HCCL use).

For a group of n ranks, message size S bytes (the full, unsharded tensor), per-rank link bandwidth
B (bytes/s per direction) reached at efficiency e, and per-hop latency a (s):

    all-reduce        t = 2(n-1)/n * S / (B e) + 2(n-1) a
    all-gather        t =  (n-1)/n * S / (B e) +  (n-1) a      (S = gathered output size)
    reduce-scatter    t =  (n-1)/n * S / (B e) +  (n-1) a      (S = input size before scatter)
    all-to-all        t =  (n-1)/n * S / (B e) +  (n-1) a      (S = bytes each rank sends in all)
    send/recv         t =  S / (B e) + a

Gradient reductions move `wire bytes` per element (GRAD_WIRE_BYTES): 4 (fp32), 2 (bf16/fp16), or for
int8 one byte plus the per-block scale (ZeRO++'s qgZ: block-wise absmax-scaled int8, an fp32 scale per
INT8_BLOCK elements, dequantized and summed in fp32). The int8 reduction also runs quantize and
dequantize kernels: memory-bound passes whose bytes per element `quantized_pass_bytes` states.

A group whose ranks share a node uses the node's link (NVLink, xGMI, HCCS, ...); a group that
crosses nodes is limited by the NICs: a ring collective by those of its ranks on each node, which NCCL
drives in parallel (`link_for`), all-to-all and send/recv by each rank's own.
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_profiles import HardwareProfile
from hardware_profiles.errors import UserError


@dataclass(frozen=True)
class Link:
    bandwidth: float   # bytes/s per direction per rank
    latency: float     # s per hop
    efficiency: float  # achieved fraction of bandwidth

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency


def link_for(profile: HardwareProfile, span: str, ranks_per_node: int = 1) -> Link:
    """The link a mesh dimension's collectives run on: 'intra' (inside a node) or 'inter'.

    A ring collective (all-reduce, all-gather, reduce-scatter) of a group that crosses nodes with
    `ranks_per_node` of its ranks on each node runs that many rings at once, each leaving the node through
    another rank's NIC (NCCL maps one channel to each NIC; every other hop of a ring stays on the node's
    links): each rank then moves its share at ranks_per_node NICs' bandwidth, up to what its intra-node link
    carries. One rank per node (the data-parallel group of tp=8 on 8-GPU nodes) is bound by its own NIC.
    All-to-all and send/recv leave through each rank's own NIC: call them with the default 1."""
    eff = profile.efficiency
    if span == "intra":
        return Link(profile.intra_bandwidth, profile.intra_latency, eff.collective_intra)
    nic = Link(profile.inter_bandwidth, profile.inter_latency, eff.collective_inter)
    if ranks_per_node <= 1:
        return nic
    node = profile.intra_bandwidth * eff.collective_intra
    return Link(min(ranks_per_node * nic.effective_bandwidth, node), profile.inter_latency, 1.0)


COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")


def collective_terms(op: str, n: int) -> tuple[float, float]:
    """(f, k) of t = f S / (B e) + k a for collective `op` over n ranks (the module docstring's table);
    the one definition that the time functions and calibrate's fit both read."""
    if op == "send_recv":
        return 1.0, 1.0
    if op == "all_reduce":
        return 2 * (n - 1) / n, 2.0 * (n - 1)
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n, float(n - 1)
    raise ValueError(f"unknown collective {op!r}; one of {', '.join(COLLECTIVES)}")


# int8 gradient reduction (autoparallel.trainer.low_precision): an fp32 absmax scale per block of
# INT8_BLOCK elements, so each element costs 1 + 4/256 = 1.016 bytes on the wire
INT8_BLOCK = 256
INT8_SCALE_BYTES = 4
GRAD_WIRE_BYTES = {"fp32": 4.0, "bf16": 2.0, "fp16": 2.0, "int8": 1.0 + INT8_SCALE_BYTES / INT8_BLOCK}


def quantized_pass_bytes(op: str, n: int) -> float:
    """Bytes the int8 quantize / dequantize kernels move per element of the reduced (unsharded) tensor.

    reduce-scatter (all-to-all of int8 chunks, local fp32 sum), per element of the input S:
        quantize   read 4 (fp32 input), write q = 1 + scale bytes
        dequantize read q for each of the n received chunks (n * S/n = S elements), write 4/n (the fp32 shard)
      = 4 + 2q + 4/n
    all-reduce = that reduce-scatter, then the reduced shard re-quantized (read 4/n, write q/n), all-gathered
        as int8 and dequantized (read q, write 4): + (4 + q)/n + q + 4
    """
    q = GRAD_WIRE_BYTES["int8"]
    rs = 4 + 2 * q + 4 / n
    if op == "reduce_scatter":
        return rs
    if op == "all_reduce":
        return rs + (4 + q) / n + q + 4
    raise ValueError(f"quantized reduction of {op!r}: one of reduce_scatter, all_reduce")


def gradient_reduce_time(op: str, elements: float, n: int, link: Link, dtype: str,
                         quant_bandwidth: float) -> float:
    """Time of one gradient reduction ("reduce_scatter" or "all_reduce") of `elements` gradient
    elements over n ranks in `dtype` [s]: the collective on GRAD_WIRE_BYTES per element, plus for int8
    the quantize/dequantize passes at quant_bandwidth (bytes/s of a memory-bound cast kernel). An int8
    all-reduce runs as a reduce-scatter and an all-gather of int8 payloads (the wire bytes of an
    all-reduce: 2(n-1)/n S)."""
    if elements <= 0 or n <= 1:
        return 0.0
    t = collective_time(op, elements * GRAD_WIRE_BYTES[dtype], n, link)
    if dtype == "int8":
        t += elements * quantized_pass_bytes(op, n) / quant_bandwidth
    return t


@dataclass(frozen=True)
class DpSchedule:
    """What data parallelism does to each parameter unit in one step: `unshards` parameter all-gathers (under
    ZeRO-0 a local cast copy: its parameters are replicated) and `reductions` gradient reductions (reduce-
    scatters; under ZeRO-0 all-reduces). One definition for the collectives' time (estimate.dp_sync_time),
    the ranks' host meetings at them (CostModel.fsdp_collective_time) and the copies around them
    (compute.fsdp_update_time)."""
    unshards: int
    reductions: int


def trainer_dp_schedule(zero: int, micro_batches: int, pipelined: bool) -> DpSchedule:
    """AutoParallelTrainer's FSDP2 units (trainer.data_parallel) over `micro_batches` micro-batches.

    Without a pipeline: ZeRO 0-2 do not reshard after the forward but do after each backward, so every
    micro-batch gathers once (ZeRO-3, which reshards after the forward too, twice); ZeRO 0-1 reduce after the
    last micro-batch only, ZeRO 2-3 after each. Under pipeline parallelism torch.distributed.pipelining's
    stage turns gradient sync and resharding after backward off for every backward
    (PipelineStage.backward_maybe_with_nosync) and reduces once after the last (perform_reduce_grad): a unit
    stays unsharded from its first backward to the end of the step, with its gradients accumulating
    unsharded, in every ZeRO mode. ZeRO 0-2 then gather once a step; ZeRO-3 still reshards after each forward,
    so each backward that follows a forward of its unit gathers again: in 1F1B (interleaved or not) the
    stage's warm-up forwards and every backward but the ones of the cool-down, m + 1 in all. Counted on CPU
    by tests/test_dp_schedule.py."""
    m = micro_batches
    if pipelined:
        return DpSchedule(m + 1 if zero >= 3 else 1, 1)
    return DpSchedule(m * (2 if zero >= 3 else 1), m if zero >= 2 else 1)


def megatron_dp_schedule(zero: int, micro_batches: int) -> DpSchedule:
    """Megatron-LM's and DeepSpeed's ZeRO stages: ZeRO-1 (the distributed optimizer) reduce-scatters the
    gradients and all-gathers the updated parameters once a step, ZeRO-2 reduce-scatters every micro-batch,
    ZeRO-3 also gathers the parameters for each micro-batch's forward and backward."""
    m = micro_batches
    return DpSchedule({0: 0, 1: 1, 2: 1}.get(zero, 2 * m), m if zero >= 2 else 1)


def collective_time(op: str, size_bytes: float, n: int, link: Link) -> float:
    """f S / (B e) + k a   [s]; nothing moves for a group of one or an empty message."""
    if size_bytes <= 0 or (n <= 1 and op != "send_recv"):
        return 0.0
    f, k = collective_terms(op, n)
    return f * size_bytes / link.effective_bandwidth + k * link.latency


def all_reduce_time(size_bytes: float, n: int, link: Link) -> float:
    """2(n-1)/n * S/(B e) + 2(n-1) a   [s]"""
    return collective_time("all_reduce", size_bytes, n, link)


def all_gather_time(size_bytes: float, n: int, link: Link) -> float:
    """(n-1)/n * S/(B e) + (n-1) a   [s], S = the gathered (full) size"""
    return collective_time("all_gather", size_bytes, n, link)


def reduce_scatter_time(size_bytes: float, n: int, link: Link) -> float:
    """(n-1)/n * S/(B e) + (n-1) a   [s], S = the input size before the scatter"""
    return collective_time("reduce_scatter", size_bytes, n, link)


def all_to_all_time(size_bytes: float, n: int, link: Link) -> float:
    """(n-1)/n * S/(B e) + (n-1) a   [s], S = the bytes each rank sends (it keeps 1/n)"""
    return collective_time("all_to_all", size_bytes, n, link)


def send_recv_time(size_bytes: float, link: Link) -> float:
    """S/(B e) + a   [s]"""
    return collective_time("send_recv", size_bytes, 2, link)


def overlapped_collective_exposure(comm_s: float, compute_s: float, n: int) -> float:
    """The part of n-rank collectives that GEMMs running beside them leave exposed [s]: Transformer Engine's
    tensor-parallel overlap (Megatron's --tp-comm-overlap) splits each all-gather + GEMM (and GEMM +
    reduce-scatter) into n chunks as a ring, the first chunk computing on the rank's own shard while the next
    shard arrives, and runs the backward's collectives beside an independent GEMM (its "bulk" overlap). With
    the collectives' time c spread over n - 1 transfers and the GEMMs' time g over n chunks:

        t = g + max(0, c - g (n - 1) / n)      (all hidden while each transfer fits under a chunk; else the
                                                transfers set the pace and the last chunk runs after them)

    The chunks' SMs lent to communication kernels (a few of 132 on an H100) are not priced."""
    if n <= 1:
        return comm_s
    return max(0.0, comm_s - compute_s * (n - 1) / n)


# kappa of dp_overlap_cost for a profile that has not measured its own (calibration.overlap_interference): the
# H200's, fitted on the trainer's two-GPU steps (docs/overlap_interference.md). Every NVIDIA and AMD part runs
# its collectives as kernels on the SMs / CUs the GEMMs use, so the effect is there; its size elsewhere is assumed
OVERLAP_INTERFERENCE_DEFAULT = 1.0


def overlap_interference(profile: HardwareProfile) -> float:
    """kappa of dp_overlap_cost: the profile's calibration.overlap_interference, else the default; above 1 the
    maximum of dp_overlap_cost no longer holds (an overlapped collective would cost more than one in line)."""
    value = (profile.calibration or {}).get("overlap_interference")
    if value is None:
        return OVERLAP_INTERFERENCE_DEFAULT
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise UserError(f"hardware profile {profile.name}: calibration.overlap_interference {value!r} is not a "
                        f"number in [0, 1]; set it to the compute seconds lost per second of overlapped collective, "
                        f"or leave it out for the default {OVERLAP_INTERFERENCE_DEFAULT}")
    return float(value)


def dp_overlap_cost(total_s: float, cover_s: float, idle_s: float, interference: float) -> tuple[float, float]:
    """(exposed, interference) [s] of a stage's data-parallel collectives of `total_s` that run beside
    `cover_s` of its work, in which the GPU waits `idle_s` for the host (SegmentCost.idle_s).

    The part the work does not cover is exposed: E = max(0, T - W). The part it covers is not free: the
    collective's kernels hold SMs (an all-gather's 24 CTAs of an H100's 132 push a one-wave GEMM into a second
    wave) and memory bandwidth while the GEMMs beside them run, so the work slows by `interference` (kappa)
    seconds per second of collective it hides, less the time the GPU idles anyway:

        I = max(0, kappa min(T, W) - S)

    and E + I = max(0, kappa T - S, T - W, T - (1 - kappa) W - S) for 0 <= kappa <= 1: a maximum of affine
    terms, which the planner's models state as one row each. On two H200s the GEMM kernels of a 1.3B llama's
    FSDP2 step took 5-9% longer than on one (benchmarks/results/raw/timeline_h200_{a,b}.jsonl; the fit:
    docs/overlap_interference.md); arXiv 2507.03114 measured 18.9% mean compute slowdown under overlap on
    A100, H100 and MI250 (40% at most)."""
    exposed = max(0.0, total_s - cover_s)
    return exposed, max(0.0, *dp_overlap_pieces(total_s, cover_s, idle_s, interference)) - exposed


def dp_overlap_pieces(total, cover, idle, interference: float) -> tuple:
    """The affine pieces of dp_overlap_cost's exposed + interference beside 0 (T - W, kappa T - S,
    T - (1 - kappa) W - S), of numbers or of a solver's linear expressions: the planner's rows are these."""
    return (total - cover, interference * total - idle, total - (1.0 - interference) * cover - idle)


def ring_attention_time(compute_s: float, step_bytes: float, cp: int, link: Link, tail_bytes: float = 0.0) -> float:
    """Ring attention over cp ranks (context parallelism) [s]: the rank's attention work compute_s runs
    as cp equal steps (causal load balancing gives every step the same share), and during each of the
    first cp - 1 steps the rank sends the chunk it holds (forward: K/V; backward: K/V and the dK/dV
    accumulated so far) to the next rank and receives the previous rank's, overlapped with that step's
    compute; backward then returns the dK/dV chunk once more after the last step, exposed (tail_bytes):

        t = compute_s / cp + (cp - 1) * max(compute_s / cp, S / (B e) + a) + [T / (B e) + a]
                                                               S = step_bytes, T = tail_bytes

    so the exposed communication is (cp - 1) * max(0, S / (B e) + a - compute_s / cp) + the tail."""
    if cp <= 1:
        return compute_s
    step = compute_s / cp
    tail = send_recv_time(tail_bytes, link) if tail_bytes > 0 else 0.0
    return step + (cp - 1) * max(step, send_recv_time(step_bytes, link)) + tail
