"""Predicted step time, throughput and memory of a Plan on a Cluster, from the operator graph.

The composition (every term per device, seconds or bytes):

  per micro-batch, segment k on its stage:  F_k (fwd compute + TP/EP comm), B_k (bwd), R_k (recompute)
  per device d:  T_d = sum over its segments (F_k + B_k + R_k) + P2P sends at stage boundaries
  pipeline:      t_pipe = m * T_max + (sum_d T_d - T_max) / v          (1F1B: v = 1;  Narayanan 2021:
                                                                         bubble (p-1)/(v m) when balanced)
                 zero bubble: T_d in the bubble term becomes F_d + I_d - min(F_d, I_d, W_d), W_d the
                 weight-gradient GEMMs (cost_models.pipeline_schedule, the one definition of both)
  data parallel: t_dp   = exposed part of the gradient all-reduce / reduce-scatter after the last
                          backward (overlapped with it) + ZeRO-3 parameter all-gathers not hidden
                          + the slowdown of the work the rest hides behind (comm.dp_overlap_cost)
  step:          t      = t_pipe + t_dp + t_optimizer

Memory per device d (bytes):
  model states   N_d * (p + g + k) sharded by ZeRO stage over the data-parallel group (Rajbhandari
                 et al.: p = 2 bf16 params, g = grad bytes, k = 12 fp32 master + Adam moments)
  activations    in_flight(d) * sum_k A_k(recompute) + the largest block's working set in its backward (its
                 rematerialized activations, and an eager attention's two seq x seq softmax gradients)
                 beyond the logits buffers (the two never coexist: the loss backward frees the logits
                 before any block's backward)
                 (1F1B: in_flight = min(m, p - d); interleaved: (p - d) + (p - 1)/v, Korthikanti 2022)
  buffers        fp32 logits on the last stage, ZeRO-3 all-gather buffers, allocator reserve
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from typing import TYPE_CHECKING

import numpy as np

from cost_models.comm import (
    DpSchedule,
    Link,
    all_gather_time,
    all_reduce_time,
    all_to_all_time,
    dp_overlap_cost,
    gradient_reduce_time,
    link_for,
    megatron_dp_schedule,
    overlap_interference,
    overlapped_collective_exposure,
    reduce_scatter_time,
    ring_attention_time,
    send_recv_time,
    trainer_dp_schedule,
)
from cost_models.compute import (
    ATTENTION_KERNELS,
    CLASS_CODE,
    FP8_EAGER_KERNELS,
    OP_SAC_POLICIES,
    attention_times,
    compiled_host_floor,
    compiled_times,
    fp8_gemm_times,
    fsdp_update_time,
    host_floor,
    index_put_times,
    memory_fraction,
    op_times,
    stream_gap_seconds,
    stretch_to,
    update_time,
)
from cost_models.facts import (
    attention_geometry,
    attention_heads,
    convolution_mixers,
    flattens_tokens,
    no_grad_modules,
    num_experts,
    replicated_regions,
    scales_logits,
    sees_split_heads,
    spans_split_heads,
    splits_whole_heads,
    vocab_size,
)
from cost_models.graph import OpGraph
from cost_models.host import HostTerms
from cost_models.pipeline_schedule import RankTimes, pipeline_time
from cost_models.segments import Segment, SegmentCache, block_classes
from hardware_profiles import Cluster
from hardware_profiles.errors import UserError

if TYPE_CHECKING:  # the Plan type is the planner's (autoparallel.plan); cost models only read its fields
    from autoparallel.plan import Plan

PlacementSolver = Callable[[int, bool], dict[str, str]]
GIB = 2**30
RUNTIMES = ("trainer", "megatron")
OPTIMIZER_BYTES_PER_PARAM = 12   # fp32 master copy + Adam m + v
DTYPE_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}
# bytes per gradient element held in memory by grad_reduce_dtype: an int8 reduction accumulates in fp32
# (what goes on the wire is cost_models.comm.GRAD_WIRE_BYTES)
GRAD_STATE_BYTES = {**DTYPE_BYTES, "int8": 4}
ALLOCATOR_RESERVE = 0.03         # fraction of peak lost to caching-allocator fragmentation


@dataclass(frozen=True)
class RuntimeVariant:
    """What another runtime does differently from AutoParallelTrainer, whose choices are the defaults: the
    torch-native ones (FSDP2, blocks compiled one by one) in their checkpointing, loss and attention kernel,
    Megatron's in its TP overlap. Published runs state theirs (benchmarks/validate_published.py); the trainer,
    planning itself, passes the attention kernel its torch picks on the device (trainer.hardware.attention_kernel);
    the CLI plans with the defaults."""
    op_sac: str = "trainer"      # per-op selective checkpointing's saved set, compute.OP_SAC_POLICIES
    compiles_loss: bool = True   # torch.compile of the loss with the blocks, where the trainer compiles it
    attention: str = "default"   # SDPA's causal kernel, compute.ATTENTION_KERNELS (torch's pick changed in 2.9)
    # TP collectives (under sequence parallelism) overlapped with the GEMMs beside them, as Transformer Engine
    # does under Megatron's --tp-comm-overlap (comm.overlapped_collective_exposure); the trainer's DTensor TP
    # runs them in line
    tp_comm_overlap: bool = False
    # the trainer's max_grad_norm: a global-norm pass over the gradients and their scaling before each update
    # (compute.fsdp_update_time's clip); torchtitan and Hugging Face's Trainer clip by default, Megatron's
    # update_time was fitted to runs that clipped
    clip_grad_norm: bool = False

    def __post_init__(self) -> None:
        if self.op_sac not in OP_SAC_POLICIES:
            raise UserError(f"op_sac {self.op_sac!r} is not one of {', '.join(OP_SAC_POLICIES)}")
        if self.attention not in ATTENTION_KERNELS:
            raise UserError(f"attention {self.attention!r} is not one of {', '.join(ATTENTION_KERNELS)}")


TRAINER = RuntimeVariant()


@dataclass(frozen=True)
class HostWork:
    """The trainer's host work in one phase of a segment beyond the plain per-op dispatch [s]."""
    per_op_s: float = 0.0   # per op of the phase
    extra_s: float = 0.0    # once per phase
    fsdp_s: float = 0.0     # once per phase, in FSDP2's hooks around the block: paid compiled or eager


@dataclass(frozen=True)
class SegmentCost:
    """Cost of one segment for one micro-batch on one device (seconds / bytes)."""
    fwd_s: float
    bwd_s: float
    recompute_s: float
    tp_comm_s: float        # included in fwd_s + bwd_s (+ recompute_s): exposed TP collectives
    ep_comm_s: float        # included likewise: EP all-to-alls
    act_bytes: float        # activations kept per micro-batch until its backward
    working_bytes: float    # transient during its own backward: rematerialized activations, seq x seq gradients
    flops_fwd: float        # per device
    flops_bwd: float
    flops_recompute: float
    cp_comm_s: float = 0.0  # included in fwd_s + bwd_s (+ recompute_s): exposed ring-attention exchanges
    wgrad_s: float = 0.0    # included in bwd_s: the weight-gradient GEMMs (a zero-bubble schedule's W)
    # how far the GPU's work outlasts the host's issuing of it: total_s - host time (>= 0). The host runs
    # that far ahead by the end of the backward, time in which the ranks' FSDP meetings hide
    # (CostModel.tail_host_time)
    lead_s: float = 0.0
    # included in total_s: the time the GPU waits for the host within the phases (the host floor's stretch),
    # in which collectives running beside the ops slow nothing (comm.dp_overlap_cost)
    idle_s: float = 0.0

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s + self.recompute_s


@dataclass
class Estimate:
    plan: Plan
    step_time_s: float
    tokens_per_s: float
    model_tflops_per_gpu: float
    hardware_tflops_per_gpu: float
    mfu: float
    peak_memory_gib: float
    memory_per_stage_gib: list[float]
    memory_breakdown_gib: list[dict[str, float]]
    fits: bool
    budget_gib: float
    breakdown: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return {
            "step_time_s": self.step_time_s, "tokens_per_s": self.tokens_per_s,
            "model_tflops_per_gpu": self.model_tflops_per_gpu,
            "hardware_tflops_per_gpu": self.hardware_tflops_per_gpu, "mfu": self.mfu,
            "peak_memory_gib": self.peak_memory_gib, "memory_per_stage_gib": self.memory_per_stage_gib,
            "memory_breakdown_gib": self.memory_breakdown_gib,
            "fits": self.fits, "budget_gib": self.budget_gib, "breakdown": self.breakdown,
        }


def model_state_bytes(params: float, zero: int, dp: int, param_bytes: int = 2, grad_bytes: int = 2,
                      optimizer_bytes: int = OPTIMIZER_BYTES_PER_PARAM) -> tuple[float, float, float]:
    """(parameter, gradient, optimizer) bytes per data-parallel rank (Rajbhandari et al. 2020).

    ZeRO-1 shards the optimizer states over the dp ranks, ZeRO-2 also the gradients, ZeRO-3 also the
    parameters: e.g. params=7.5e9, dp=64, 2+2+12 bytes: 120 GB -> 31.4 -> 16.6 -> 1.9 GB.
    """
    return (params * param_bytes / (dp if zero >= 3 else 1),
            params * grad_bytes / (dp if zero >= 2 else 1),
            params * optimizer_bytes / (dp if zero >= 1 else 1))


def carry_forward_lead(fwd_lead_s: float, bwd_s: float, recompute_s: float, rec_idle_s: float, bwd_idle_s: float
                       ) -> tuple[float, float, float, float]:
    """A block's (backward, recompute, replay idle, backward idle) [s] less the host's lead from its forward.
    Nothing in a trainer step synchronizes between a block's forward and its backward, so where the forward is
    GPU-bound (its kernels outlast the host's issue: `fwd_lead_s` > 0) the host runs ahead into the backward by
    that much, and a host-bound replay (first) and backward (then) wait on it that much less. Per block, so the
    planner's per-segment costs keep it; for a model of identical blocks it is the micro-batch's sum of leads
    against its sum of waits. Measured (s107, docs/trainer_sweep_notes.md
    "Thirty-fourth session"): AFMoE's and Laguna's blocks under full recompute, priced with the backward
    host-paced (13 and 7 ms a micro-batch of GPU idle), ran at the same step time while the host's speed
    probes moved by a fifth, 588-596 and 383-394 ms: the GPU set the pace."""
    lead = max(0.0, fwd_lead_s)
    used_rec = min(lead, rec_idle_s)
    used_bwd = min(lead - used_rec, bwd_idle_s)
    return bwd_s - used_bwd, recompute_s - used_rec, rec_idle_s - used_rec, bwd_idle_s - used_bwd


class CostModel:
    """Cost of plans for one traced graph on one cluster. Segment analyses are cached per
    (placements, sequence parallel) and segment costs per (segment, tp, ep, sp, micro-batch, recompute),
    so the planner can query thousands of variants cheaply; `estimate(plan)` is the single definition
    of a plan's cost that planner objective and `autoparallel estimate` share."""

    def __init__(self, graph: OpGraph, cluster: Cluster, dtype: str = "bf16", overlap_grad_sync: bool = True,
                 runtime: str = "trainer", segment_cache: SegmentCache | None = None,
                 variant: RuntimeVariant = TRAINER):
        """overlap_grad_sync: the runtime overlaps the data-parallel gradient reduction with the
        backward pass (PyTorch DDP/FSDP2, torchtitan, Megatron-LM since 2023 do; Megatron-LM of 2021
        reduced after the backward pass).
        runtime: "trainer" (AutoParallelTrainer: FSDP2 mixed precision, gradients freed by
        zero_grad(set_to_none=True) and born again in each step's backward) or "megatron" (Megatron-LM:
        a persistent fp32 gradient buffer); see `grads_resident`.
        segment_cache: the graph's segment analyses, shared with other cost models of the same graph (they
        read no profile); a new one when not given.
        variant: where the runtime differs from AutoParallelTrainer (RuntimeVariant)."""
        if runtime not in RUNTIMES:
            raise UserError(f"runtime {runtime!r} is not one of {', '.join(RUNTIMES)}")
        self.variant = variant
        self.overlap_grad_sync = overlap_grad_sync
        self.runtime = runtime
        self.graph = graph
        self.cluster = cluster
        self.profile = cluster.profile
        self.dtype = dtype
        if segment_cache is not None and segment_cache.graph is not graph:
            raise ValueError("CostModel: segment_cache belongs to another graph")
        self.segment_cache = segment_cache or SegmentCache(graph)
        self._solved_placements: dict[tuple[int, bool], dict[str, str]] = {}
        # (tp, sequence parallel) -> placements of a plan that has none: handed in by the layer above
        # (autoparallel.sharding.cost_model), so cost models never import the solver
        self.placement_solver: PlacementSolver | None = None
        self.block_class = block_classes(graph)          # class id per block, in block order
        self.heads, self.kv_heads = attention_heads(graph)
        self.attention_seq, self.head_dim = attention_geometry(graph)
        self.num_experts = num_experts(graph)
        self.vocab_size = vocab_size(graph)
        self.scales_logits = scales_logits(graph)
        # read once, like the facts above: fsdp_units asks per stage model (~10^3 times a plan), and the
        # graph's property scans every parametric op each time
        self.tied_parameters = graph.has_tied_parameters
        self.host = HostTerms.of(self.profile) if runtime == "trainer" else HostTerms()
        self.interference = overlap_interference(self.profile)  # comm.dp_overlap_cost's kappa
        self.segment_cost = lru_cache(maxsize=None)(self._segment_cost)
        # a handful of distinct (d, zero, m, dtypes, pp) per plan search, asked per stage model and bound
        self._update_seconds = lru_cache(maxsize=None)(self._update_seconds_of)

    # ---- graph facts ---------------------------------------------------------------------------------
    @property
    def num_blocks(self) -> int:
        return len(self.graph.blocks)

    def block_rep(self, block_index: int) -> str:
        cls = self.block_class[block_index]
        return self.graph.blocks[self.block_class.index(cls)]

    def segments(self, placements: dict[str, str], sp: bool) -> dict[str, Segment]:
        return self.segment_cache[self.segments_key(placements, sp)]

    def segments_key(self, placements: dict[str, str], sp: bool) -> tuple:
        """Cache key of a (placements, sequence-parallel) analysis (SegmentCache.key)."""
        return self.segment_cache.key(placements, sp)

    # ---- one segment ---------------------------------------------------------------------------------
    def _segment_cost(self, placements_key: tuple, name: str, tp: int, ep: int, sp: bool, micro_batch: int,
                      recompute: str, tp_span: str, ep_span: str, compiled: bool = False, cp: int = 1,
                      cp_span: str = "intra", fp8: str = "none") -> SegmentCost:
        """Per-op roofline on the shard each device runs, plus exposed TP and EP collectives.

        Sharded ops run 1/tp of their FLOPs and bytes; replicated ops run whole, or on 1/tp of the
        sequence under sequence parallelism. TP (b*s*h*2 bytes each): forward, an all-reduce of each
        rowwise/vocab output; backward, an all-reduce of the gradient of each distinct colwise input;
        under SP a reduce-scatter + all-gather pair in each direction. EP: dispatch + combine
        all-to-all forward and backward. Recompute re-runs forward ops in backward (full: the whole
        segment with its collectives; selective: the seq x seq attention core (Korthikanti et al.); op: every
        op whose outputs per-op selective checkpointing does not save, compute.OP_SAC_SAVED, whose
        outputs and the block input are what op keeps).

        Context parallelism (cp > 1) gives each rank 1/cp of every sequence: per-token work, bytes and
        activations scale by micro_batch / cp (the samples' worth of tokens a rank holds), and with causal
        load balancing so does its share of the seq x seq attention FLOPs; weights are read whole. The
        attention kernels run as a ring (comm.ring_attention_time): forward, the rank's K/V chunk passes
        on at each of cp - 1 steps; backward, K/V and their gradients, which torch's ring accumulates and
        rotates in fp32 (its _cp_options.convert_to_f32), plus one last dK/dV return after the last step.
        fp8: the block's FP8 recipe; its linear GEMMs run on the FP8 curve with their operand casts
        (compute.fp8_gemm_times).
        A compiled block without recompute keeps what AOTAutograd's partitioner saves (`_compiled_saved`).
        """
        seg = self.segment_cache[placements_key][name]
        # the trainer compiles each block and, at tp = cp = 1, the loss; the embedding runs eager
        compiled = compiled and name != "pre" and (name != "post" or self.compiled_loss(compiled, tp, cp))
        # an op whose output shape is data (a per-expert loop's nonzero) breaks Dynamo's graph and the block's loop
        # runs as eager Python: priced eager, as a per-expert loop's dynamic GEMMs are (`_phase_times`)
        compiled = compiled and not seg.fwd.graph_break.any()
        recompute = self.runtime_recompute(name, recompute)
        b = float(micro_batch) / cp
        # the trainer's host work around the ops (cost_models.host): per-op dispatch of DTensor and of per-op
        # checkpointing; the backward recomputes each checkpointed region
        h = self.host
        checkpointed = recompute != "none" and name not in ("pre", "post")
        # TP collectives per phase: Megatron's g and f (an all-reduce each), or under SP a reduce-scatter
        # and an all-gather each way; gathers into replicated modules run forward only
        g, f = len(seg.tp_collective_bytes), len(seg.tp_col_input_bytes)
        fwd_colls, bwd_colls = ((g + f, g + f) if sp else (g, f)) if tp > 1 else (0, 0)
        fwd_colls += len(seg.tp_gather_bytes) if tp > 1 else 0
        # FSDP2's hooks loop over the unit's parameter tensors in every micro-batch and ZeRO mode: unshard
        # before the forward, accumulate (in fp32) or reduce the gradients and reshard after the backward
        # (cost_models.host host_us_per_fsdp_tensor), half charged to each phase
        fsdp = 0.5 * h.fsdp_tensor_s * self.fsdp_tensors(seg)
        sac = recompute == "op"
        fwd_host = HostWork(per_op_s=h.dtensor_op_s * (tp > 1) + h.sac_op_s * sac,
                            extra_s=h.tp_collective_s * fwd_colls + h.sac_tensor_s * seg.param_tensors * sac,
                            fsdp_s=fsdp)
        bwd_host = HostWork(per_op_s=h.dtensor_op_s * (tp > 1), extra_s=h.tp_collective_s * bwd_colls + (
            h.checkpoint_s + h.recompute_op_s * self._recomputed_ops(seg, recompute) if checkpointed else 0.0),
            fsdp_s=fsdp)
        tp_link = link_for(self.profile, tp_span)
        tp_comm_fwd = tp_comm_bwd = 0.0
        if tp > 1:
            if sp:  # symmetric: each forward reduce-scatter is an all-gather backward and vice versa
                tp_comm_fwd = sum(reduce_scatter_time(x * b, tp, tp_link) for x in seg.tp_collective_bytes)
                tp_comm_fwd += sum(all_gather_time(x * b, tp, tp_link) for x in seg.tp_col_input_bytes)
                tp_comm_bwd = tp_comm_fwd
            else:  # Megatron's g (all-reduce forward) and f (all-reduce of the input gradient backward)
                tp_comm_fwd = sum(all_reduce_time(x * b, tp, tp_link) for x in seg.tp_collective_bytes)
                tp_comm_bwd = sum(all_reduce_time(x * b, tp, tp_link) for x in seg.tp_col_input_bytes)
        # all-gathers of feature-sharded tensors entering replicated modules (layouts beyond Megatron's):
        # forward only, a gather's backward is a local slice
        gather = sum(all_gather_time(x * b, tp, tp_link) for x in seg.tp_gather_bytes) if tp > 1 else 0.0
        tp_comm_fwd += gather
        a2a = 0.0
        if ep > 1 and seg.ep_alltoall_bytes:
            # dispatch + combine of every token copy routed by this rank
            a2a = 2 * all_to_all_time(seg.ep_alltoall_bytes * b, ep, link_for(self.profile, ep_span))
        # the token counts read back before dispatch: the GPU idles while the host refills its queue
        ep_comm_fwd = a2a + (h.ep_sync_s if a2a > 0 and not compiled else 0.0)
        # the GPU runs a phase's TP and EP collectives in line with its ops (the trainer overlaps neither), so
        # the host sets the pace only when it issues slower than the ops and the collectives together;
        # Megatron's --tp-comm-overlap runs the SP collectives beside the phase's GEMMs (RuntimeVariant)
        overlap = self.variant.tp_comm_overlap and sp and tp > 1
        # the forward's kernels and collectives, for the forward and (checkpointed) its replay in the backward
        fwd_kw = dict(fp8=fp8, cp=cp, comm_s=a2a + (0.0 if overlap else tp_comm_fwd),
                      fused_share=self._fused_share(seg, 0) if compiled else None,
                      overlapped=(tp_comm_fwd, tp) if overlap else (0.0, 1),
                      launches=self._launches(seg, 0, b, tp, sp, cp) if compiled else 0)
        fwd_t, fwd_flops, fwd_div, fwd_host_s, fwd_exposed, fwd_idle = self._phase_times(
            seg.fwd, "fwd", tp, ep, sp, b, compiled, fwd_host, **fwd_kw)
        bwd_t, bwd_flops, bwd_div, bwd_host_s, bwd_exposed, bwd_idle = self._phase_times(
            seg.bwd, "bwd", tp, ep, sp, b, compiled, bwd_host, fp8, cp, a2a + (0.0 if overlap else tp_comm_bwd),
            self._fused_share(seg, 1) if compiled else None, (tp_comm_bwd, tp) if overlap else (0.0, 1),
            self._launches(seg, 1, b, tp, sp, cp) if compiled else 0)
        if overlap:
            tp_comm_fwd, tp_comm_bwd = fwd_exposed, bwd_exposed
        # the backward's replay of a checkpointed block's forward ops: the same kernels at the replay's own host
        # floor (`_phase_times` replay), without FSDP2's hooks, which return early in the backward (on an H200
        # the MoE's FSDP::pre_forward took 26.0 ms over two forwards and their replays, 12.0 over one forward)
        rec_t, rec_host_s = fwd_t, fwd_host_s - fsdp
        if checkpointed:
            rec_t, _, _, rec_host_s, _, _ = self._phase_times(
                seg.fwd, "fwd", tp, ep, sp, b, compiled, replace(fwd_host, fsdp_s=0.0), **fwd_kw, replay=True)

        cp_comm_fwd = cp_comm_bwd = 0.0
        if cp > 1 and seg.attn_kv_bytes:
            cp_link = link_for(self.profile, cp_span)
            kv = seg.attn_kv_bytes * b / (tp if seg.attn_sharded else 1)  # this rank's K/V chunks, all kernels

            def ring_exposed(ops, times, phase: str, step_bytes: float, tail_bytes: float = 0.0) -> float:
                attn = ops.op_class == CLASS_CODE[f"attention_{phase}"]
                n = max(int(attn.sum()), 1)  # one ring per attention kernel (layer)
                per_kernel = float(times[attn].sum()) / n
                return n * (ring_attention_time(per_kernel, step_bytes / n, cp, cp_link, tail_bytes / n) - per_kernel)

            dkv = kv * 4 / DTYPE_BYTES.get(self.dtype, 2)  # gradients of K/V, fp32 in torch's ring
            cp_comm_fwd = ring_exposed(seg.fwd, fwd_t, "fwd", kv)
            cp_comm_bwd = ring_exposed(seg.bwd, bwd_t, "bwd", kv + dkv, dkv)
        # W of a zero-bubble schedule: each linear's backward is an input-gradient GEMM (it reads the weight)
        # and a weight-gradient GEMM of the same FLOPs (it reads none); the latter is priced as its twin,
        # whose time the op table has with the weight read it does (the weight-gradient GEMM writes as much)
        wgrad_s = float(bwd_t[seg.bwd.matmul & (seg.bwd.param_bytes > 0)].sum())
        fwd_s = fwd_t.sum() + tp_comm_fwd + ep_comm_fwd + cp_comm_fwd
        bwd_s = bwd_t.sum() + tp_comm_bwd + ep_comm_fwd + cp_comm_bwd

        saved = seg.fwd.saved_bytes * b / fwd_div
        if name == "post" and self.compiled_loss(compiled, tp, cp):
            # the compiled loss keeps its input, the model's bf16 logits, not the eager cross entropy's fp32
            # log-probabilities: the loss's traced ops save nothing (the model's own ops after the head, a
            # logit scale or soft-cap, still run eager and keep what they save); a trace without the loss
            # marked: every op after the head's matmul is taken for the loss
            head = np.flatnonzero(seg.fwd.matmul)
            if head.size:
                loss = seg.fwd.loss if seg.fwd.loss.any() else np.arange(len(saved)) > head[-1]
                saved[loss] = 0.0
                saved[head[-1]] += seg.fwd.out_bytes[head[-1]] * b / fwd_div[head[-1]]
        act_all = float(saved.sum())
        input_bytes = seg.input_bytes * b / (tp if sp else 1)
        if recompute == "full":
            recompute_s, rec_flops = fwd_s - fwd_t.sum() + rec_t.sum(), float(fwd_flops.sum())
            act, working = input_bytes, act_all
        elif recompute == "selective":
            redo = ~seg.fwd.keep_selective
            recompute_s, rec_flops = float(rec_t[redo].sum()), float(fwd_flops[redo].sum())
            act = float(saved[~redo].sum())
            working = float(saved[redo].sum())
        elif recompute == "op":
            # per-op SAC stores every output of a saved op (needed by backward or not) and the block's
            # input (the checkpoint's argument); what backward needs from other ops is recomputed
            redo = ~self._keep_op(seg)
            recompute_s, rec_flops = float(rec_t[redo].sum()), float(fwd_flops[redo].sum())
            act = float((seg.fwd.out_bytes * b / fwd_div)[~redo].sum()) + input_bytes
            working = float(saved[redo].sum())
        else:
            recompute_s, rec_flops, act, working = 0.0, 0.0, act_all, 0.0
            compiled_saved = self._compiled_saved(name, compiled, tp, sp, cp)
            if compiled_saved is not None:
                # under SP every op of a block runs on 1/tp (heads or sequence), as fwd_div says
                act = compiled_saved * b / tp
        if sp and tp > 1 and self.runtime == "trainer":
            # DTensor's sequence parallelism all-gathers each colwise input once (one per attention / MLP)
            # and the colwise matmuls save that gathered tensor whole, where Megatron saves its 1/tp
            # shard and gathers again in backward; the trace attributes the saved input to its producer
            # (a norm, counted 1/tp under SP). Kept with the activations unless the mode recomputes it
            # (full, and op: per-op checkpointing saves matmul outputs, not the gather's).
            gathered = sum(seg.tp_col_input_bytes) * b * (1 - 1 / tp)
            if recompute in ("full", "op"):
                working += gathered
            else:
                act += gathered
        # an eager (or math-path) attention's softmax backward holds the gradient of the probabilities and makes
        # that of the scores: two seq x seq tensors live at once during the block's backward, eager or compiled
        # (a fused kernel still reads the one and writes the other). On an H200 Falcon 7B's math-path steps
        # peaked 9.8 GiB (mb 4) and 4.4 GiB (mb 2) above the count without them, two fp32 71 x 2048 x 2048
        # tensors a row (s47); flash attention keeps none
        softmax_bwd = seg.bwd.op_class == CLASS_CODE["softmax_backward"]
        if name not in ("pre", "post") and softmax_bwd.any():
            working += 2 * float((seg.bwd.out_bytes * b / bwd_div)[softmax_bwd].max())
        # host time of the replay: the replay floor's, in the share of its (stretched) time a mode re-runs
        rec_sum = float(rec_t.sum())
        replay = 1.0 if recompute == "full" else (float(recompute_s) / rec_sum if rec_sum > 0 else 0.0)
        host_s = fwd_host_s + rec_host_s * replay + bwd_host_s
        rec_idle = max(0.0, rec_sum - (float(fwd_t.sum()) - fwd_idle)) * replay
        # an expert layer's token-count read-back drains the GPU queue in every forward
        synced = ep > 1 and seg.ep_alltoall_bytes > 0 and not compiled and h.ep_sync_s > 0
        if name not in ("pre", "post") and not synced:
            bwd_s, recompute_s, rec_idle, bwd_idle = carry_forward_lead(
                float(fwd_s) - fwd_host_s, float(bwd_s), float(recompute_s), rec_idle, bwd_idle)
        idle = fwd_idle + rec_idle + bwd_idle
        # how far the host runs ahead of the GPU over the segment; with a read-back only the backward builds one
        lead = (max(0.0, float(bwd_s) - bwd_host_s) if synced
                else max(0.0, float(fwd_s + bwd_s + recompute_s) - host_s))
        return SegmentCost(
            fwd_s=float(fwd_s), bwd_s=float(bwd_s), recompute_s=float(recompute_s),
            tp_comm_s=tp_comm_fwd + tp_comm_bwd + (tp_comm_fwd if recompute == "full" else 0.0),
            ep_comm_s=2 * ep_comm_fwd + (ep_comm_fwd if recompute == "full" else 0.0),
            act_bytes=act, working_bytes=working,
            flops_fwd=float(fwd_flops.sum()), flops_bwd=float(bwd_flops.sum()), flops_recompute=rec_flops,
            cp_comm_s=cp_comm_fwd + cp_comm_bwd + (cp_comm_fwd if recompute == "full" else 0.0), wgrad_s=wgrad_s,
            lead_s=lead, idle_s=idle)

    def _compiled_saved(self, name: str, compiled: bool, tp: int, sp: bool, cp: int) -> float | None:
        """Bytes per sample that a block compiled by the trainer keeps for its backward, or None where the
        eager trace's saved bytes stand. The trainer torch.compile's each block, and AOTAutograd's default
        partitioner recomputes cheap pointwise chains instead of saving them (a 1.3B llama block: 118 MiB per
        row at 2048 tokens against eager's 140); the tracer ran that partitioner on each block class
        (OpGraph.compiled_saved, autoparallel.compiled_saved). Used for recompute "none" only: selective, op
        and full under compile keep the eager accounting (their checkpoints decide what is saved). At tp = 1,
        or tp > 1 with sequence parallelism, where every op of a block runs on 1/tp of its tensors (heads or
        sequence), so the tp = 1 set scales by 1/tp; the gathered colwise inputs are added after, as for
        eager. TP without SP keeps replicated and sharded tensors apart, which the partitioned graph does not
        say: eager accounting. cp > 1 turns attention into a ring, which the partitioned (cp = 1) block does not
        contain: eager accounting. Expert blocks are included (the partition of the whole block matched the
        measured compiled MoE peaks). Measured on an H200 (docs/trainer_sweep.md, s5): compiled 1.3B llama at
        8 x 2048, 47.6 GiB predicted with eager's saved bytes, 43.1 with these, 43.3 measured."""
        if self.runtime != "trainer" or not compiled or name in ("pre", "post") or cp > 1:
            return None
        if tp > 1 and not sp:
            return None
        return self.graph.compiled_saved.get(self.graph.block_class.get(name, -1))

    def runtime_recompute(self, name: str, recompute: str) -> str:
        """The recompute mode the runtime runs for `recompute` on segment `name`: AutoParallelTrainer runs
        "selective" as per-op checkpointing on blocks without the attention-core switch
        (OpGraph.selective_as_op: Hugging Face and user blocks, trainer/recompute.py); Megatron-LM always
        recomputes the attention core."""
        if recompute == "selective" and self.runtime == "trainer" and name in self.graph.selective_as_op:
            return "op"
        return recompute

    def _keep_op(self, seg: Segment) -> np.ndarray:
        """The forward ops whose outputs the runtime's per-op checkpointing saves (`op_sac`)."""
        return seg.fwd.keep_op_torchtitan if self.variant.op_sac == "torchtitan" else seg.fwd.keep_op

    def _recomputed_ops(self, seg: Segment, recompute: str) -> int:
        """Forward ops a recompute mode re-runs in the backward of one micro-batch. Selective may re-run
        none: a fused attention kernel keeps no seq x seq tensor, yet the trainer still checkpoints it."""
        keep = {"full": np.zeros(len(seg.fwd.flops), dtype=bool), "selective": seg.fwd.keep_selective,
                "op": self._keep_op(seg)}.get(recompute)
        return 0 if keep is None else int(np.count_nonzero(~keep))

    def fsdp_units(self, seg: Segment, plan: Plan) -> int:
        """FSDP2 units whose hooks run in the segment per micro-batch under the trainer
        (trainer/data_parallel.py): each block (and its expert group, wrapped apart under ep > 1 or a dense
        data-parallel group of several ranks), the root once, in "pre"; the final norm and head a unit of
        their own when no parameter is tied (under ZeRO-0 the head alone, the norm staying with the root: one
        unit at every ZeRO stage)."""
        if self.runtime != "trainer":
            return 0
        if seg.name == "post":
            return int(not self.tied_parameters)
        return 1 + (seg.name != "pre" and seg.expert_params > 0 and plan.experts_apart)

    def _fused_share(self, seg: Segment, phase: int) -> float | None:
        """The bytes a compiled block's fused kernels move in phase `phase` (0 forward, 1 backward) over the
        bytes its traced memory-bound ops move eager, at the traced batch (OpGraph.compiled_fused; None for
        the pre and post segments and blocks the partitioner could not take): compute.compiled_times."""
        fused = self.graph.compiled_fused.get(self.graph.block_class.get(seg.name, -1))
        if fused is None:
            return None
        ops = (seg.fwd, seg.bwd)[phase]
        batch = max(self.graph.batch, 1)
        eager = float(ops.act_bytes[~ops.matmul].sum()) * batch + float(ops.param_bytes[~ops.matmul].sum())
        return fused[phase] * batch / eager if eager > 0 else None

    def _launches(self, seg: Segment, phase: int, b: float, tp: int, sp: bool, cp: int) -> int:
        """Kernels a compiled block launches in phase `phase` (0 forward, 1 backward) per micro-batch of `b`
        samples (OpGraph.compiled_launches; 0 for the pre and post segments and blocks the partitioner could not
        take). Its reductions over the tokens see the rank's tokens: b samples over cp, and over tp under
        sequence parallelism."""
        counts = self.graph.compiled_launches.get(self.graph.block_class.get(seg.name, -1))
        return counts[phase].at(b / cp / (tp if sp else 1)) if counts is not None else 0

    def _phase_times(self, ops, phase: str, tp: int, ep: int, sp: bool, b: float, compiled: bool = False,
                     host: HostWork | None = None, fp8: str = "none", cp: int = 1, comm_s: float = 0.0,
                     fused_share: float | None = None, overlapped: tuple[float, int] = (0.0, 1),
                     launches: int = 0, replay: bool = False):
        """Per-op times [s], per-op FLOPs, the per-op divisor (tp for sharded work), the phase's host time
        [s] (its floor), the exposed part of its `overlapped` collectives [s] and the time the GPU waits for the
        host in it [s] (what the floor adds to the ops and collectives); eager ops pay the
        host floor with the trainer's host work `host`, compiled ones compute.compiled_times with the floor
        compute.compiled_host_floor; under an FP8 recipe the linear GEMMs take compute.fp8_gemm_times (their
        casts are memory passes of their own, which compiled_times does not shrink further) and their extra
        eager kernels join the host floor. `comm_s`: the phase's collectives, which the GPU runs in line with
        its ops: the ops are stretched until ops + collectives meet the floor. `overlapped`: (seconds, ranks) of
        collectives that run beside the phase's GEMMs (Megatron's --tp-comm-overlap), of which only the part
        comm.overlapped_collective_exposure leaves joins the in-line ones. `fused_share`: the compiled
        block's fused bytes over its eager memory-bound bytes in this phase (`_fused_share`); `launches`: the
        kernels it launches in this phase (`_launches`). `replay`: the phase is a checkpointed forward replayed in
        the backward, whose eager ops issue at the dense forward rate, in expert blocks too (benchmarks/host_mix.py,
        s42 against s36: a replayed op of the catalog MoE's block took the host 18 us, of Qwen3-MoE's and
        DeepSeek-V2's 18, of the dense families' 6-32, where the MoE forward's calibrated rate is twice the dense
        one), and whose expert GEMMs meet no new shapes (the forward just ran them)."""
        expert = ops.expert
        # sharded ops run 1/tp; replicated ones 1/tp of the sequence under SP; experts run whole
        div = np.where(ops.tp_sharded, tp, np.where(expert, 1, tp if sp else 1)).astype(float)
        flops = ops.flops * b / div
        # per-sample bytes grow with the micro-batch, except those of weight-gradient-sized tensors,
        # whose traced bytes are those of the whole traced batch
        per_mb = np.where(ops.weight_sized, self.graph.batch, b) if len(ops.weight_sized) == len(ops.flops) else b
        moved = ops.act_bytes * per_mb / div + ops.param_bytes / np.where(ops.tp_sharded, tp, 1)
        # expert weights: each EP rank holds E/ep experts and reads only those
        moved = moved - np.where(expert, ops.param_bytes * (1 - 1 / ep) / np.where(ops.tp_sharded, tp, 1), 0)
        # a grouped expert GEMM runs the E/ep local experts as its groups
        t = op_times(flops, moved, ops.matmul, self.profile, self.dtype, ops.op_class, ops.copy_bytes * b / div,
                     np.maximum(ops.groups / ep, 1.0))
        attn = ops.op_class == CLASS_CODE[f"attention_{phase}"]
        if attn.any():  # under context parallelism each ring step's kernel sees 1/cp of the keys
            masked = ops.masked_attention[attn] if len(ops.masked_attention) == len(t) else None
            at = attention_times(flops[attn], phase, self.attention_seq // cp, self.head_dim, self.profile, self.dtype,
                                 masked, self.variant.attention)
            if at is not None:
                t = t.copy()
                t[attn] = at
        if len(ops.gathered_per_row) == len(t) and ops.gathered_per_row.any():
            # an accumulating index_put takes the time of its duplicates (compute.index_put_times); a table gathered
            # per token (a weight-shaped destination: expert biases) gets more of them as the micro-batch grows
            sel = ops.gathered_per_row > 0
            per_row = ops.gathered_per_row[sel] * np.where(ops.weight_sized[sel], b / self.graph.batch, 1.0)
            # in the terms' convention (compute.index_put_bytes), grown with the micro-batch as `moved` is
            timed = index_put_times((ops.index_put_bytes * per_mb / div)[sel], per_row, self.profile)
            if timed is not None:
                t = t.copy()
                t[sel] = timed
        n_fp8 = 0
        if fp8 != "none" and len(ops.fp8_gemm) == len(t) and ops.fp8_gemm.any():
            sel = ops.fp8_gemm
            # operand elements: activations read (grow with the micro-batch) + weights read, in bf16
            cast = (ops.in_act_bytes[sel] * b / div[sel] + ops.param_bytes[sel] / np.where(ops.tp_sharded[sel], tp, 1)) / 2
            t = t.copy()
            # Transformer Engine (Megatron) fuses the casts into the neighbouring kernels, as Inductor does: neither
            # issues torchao's eager cast kernels
            fused = compiled or self.runtime == "megatron"
            t[sel] = fp8_gemm_times(flops[sel], cast, self.profile, fp8, fused)
            n_fp8 = 0 if fused else int(sel.sum())
        dynamic_gemm = expert & ops.matmul & (ops.op_class != CLASS_CODE["gemm_grouped"])
        host = host or HostWork()
        # Under torch.compile a block whose experts run as grouped GEMMs (static shapes) compiles whole: on an
        # H200 the 1.2B MoE's compiled step fused its elementwise work, experts' included, from 59 to 23 ms of
        # kernels while the grouped GEMMs stayed the same (benchmarks/results/raw/timeline_h200_d.jsonl).
        # A per-expert loop's data-dependent GEMMs break the graph, and such a block is priced as eager.
        # Either way each kernel leaves the stream idle a little (`stream_gap_seconds`): per kernel eager (an
        # op that moves bytes or does FLOPs), per launch compiled, spread over the phase's ops.
        inductor = compiled and not dynamic_gemm.any()
        if inductor:
            t = compiled_times(t, ops.matmul, moved, self.profile, fused_share)
            if len(t):
                t = t + stream_gap_seconds(self.profile, True) * launches / len(t)
        else:
            t = t + np.where((flops > 0) | (moved > 0), stream_gap_seconds(self.profile, False), 0.0)
        exposed = overlapped_collective_exposure(overlapped[0], float(t[ops.matmul].sum()), overlapped[1]) \
            if overlapped[0] > 0 else 0.0
        comm_s += exposed
        if inductor:
            floor = compiled_host_floor(self.host.compiled_call_s, phase, self.host.compiled_launch_s, launches) \
                + host.fsdp_s
        else:
            extra = n_fp8 * FP8_EAGER_KERNELS[fp8] if n_fp8 else 0.0
            floor = host_floor(len(t), self.profile, phase, None if replay else expert,
                               None if replay else dynamic_gemm, host.per_op_s, host.extra_s + host.fsdp_s, extra)
        # the GPU waits for the host this long within the phase (the ops' stretch)
        idle = max(0.0, floor - comm_s - float(t.sum()))
        return stretch_to(t, floor - comm_s), flops, div, floor, exposed, idle

    # ---- whole plan ------------------------------------------------------------------------------------
    def check_plan(self, plan: Plan) -> None:
        """Raise UserError for a plan this model and cluster cannot run."""
        plan.validate(self.num_blocks)
        if plan.gpus != self.cluster.num_devices:
            raise UserError(f"plan is for {plan.gpus} devices but the cluster has {self.cluster.num_devices}")
        heads, kv_heads = self.heads, self.kv_heads
        if heads and heads % plan.tp:
            raise UserError(f"tp={plan.tp} does not divide the {heads} attention heads; pick tp from "
                            f"{_divisors_upto(heads, plan.gpus)}")
        if kv_heads and kv_heads % plan.tp and plan.tp > 1:
            raise UserError(f"tp={plan.tp} does not divide the {kv_heads} key/value heads; pick tp from "
                            f"{_divisors_upto(kv_heads, plan.gpus)}")
        if plan.sequence_parallel and plan.tp > 1 and not self.vocab_splits_evenly(plan.tp):
            raise UserError(f"sequence parallel at tp={plan.tp} needs the vocabulary ({self.vocab_size} rows) to "
                            f"divide tp; pad the vocabulary to a multiple of {plan.tp} or drop sequence parallel")
        experts = self.num_experts
        if plan.ep > 1 and not experts:
            raise UserError(f"ep={plan.ep} but the model has no expert layers; use ep=1")
        if experts and experts % plan.ep:
            raise UserError(f"ep={plan.ep} does not divide the {experts} experts")
        if plan.cp > 1 and not self.has_fused_attention:
            raise UserError(f"cp={plan.cp} (context parallelism) needs fused attention (scaled_dot_product_attention), "
                            f"which ring attention splits over the sequence; this model's attention is eager: use "
                            f"attn_impl sdpa or cp=1")
        if plan.pp * plan.vpp > self.num_blocks:
            raise UserError(f"pp*vpp = {plan.pp * plan.vpp} virtual stages but the model has only "
                            f"{self.num_blocks} blocks")

    def estimate(self, plan: Plan, max_memory_bytes: float | None = None) -> Estimate:
        self.check_plan(plan)
        budget = self._budget(max_memory_bytes)
        stages = self.stage_costs(plan)
        m, v, p = plan.num_micro_batches, plan.vpp, plan.pp
        T = [s["time"] for s in stages]
        t_pipe = pipeline_time(getattr(plan, "pipeline_schedule", ""), [s["rank_times"] for s in stages], m, v)
        bubble = t_pipe - m * sum(T) / p
        dp_exposed, dp_interference, dp_total, opt = self._data_parallel_time(plan, stages)
        step = t_pipe + dp_exposed + dp_interference + opt

        tokens = plan.global_batch * plan.seq_len
        mb_per_rank = m * plan.micro_batch
        model_flops = sum(s["flops_model"] for s in stages) / plan.micro_batch * mb_per_rank
        hw_flops = sum(s["flops_hw"] for s in stages) / plan.micro_batch * mb_per_rank
        # every device of a stage does its stage's work; per-GPU rates average over the pp stages
        model_tflops = model_flops / p / step / 1e12
        hw_tflops = hw_flops / p / step / 1e12
        peak = self.profile.peak(self.dtype)
        mem = [s["memory"] for s in stages]
        totals = [sum(x.values()) for x in mem]
        agg = lambda key: sum(s[key] for s in stages) / p * m  # noqa: E731  (mean over stages, per step)
        breakdown = {
            "compute_s": agg("compute"), "tp_comm_s": agg("tp_comm"), "ep_comm_s": agg("ep_comm"),
            "cp_comm_s": agg("cp_comm"),
            "recompute_s": agg("recompute"), "pp_p2p_s": agg("p2p"), "pipeline_bubble_s": bubble,
            "dp_comm_exposed_s": dp_exposed, "dp_interference_s": dp_interference, "dp_comm_total_s": dp_total,
            "optimizer_s": opt,
        }
        return Estimate(
            plan=plan, step_time_s=step, tokens_per_s=tokens / step,
            model_tflops_per_gpu=model_tflops, hardware_tflops_per_gpu=hw_tflops,
            mfu=model_tflops * 1e12 / peak,
            peak_memory_gib=max(totals) / GIB, memory_per_stage_gib=[t / GIB for t in totals],
            memory_breakdown_gib=[{k: val / GIB for k, val in x.items()} for x in mem],
            fits=max(totals) <= budget, budget_gib=budget / GIB, breakdown=breakdown)

    def _budget(self, max_memory_bytes: float | None) -> float:
        usable = self.profile.usable_memory_bytes
        return float(min(usable, max_memory_bytes) if max_memory_bytes else usable)

    # ---- per pipeline rank -----------------------------------------------------------------------------
    def placements_for(self, plan: Plan) -> dict[str, str]:
        """The plan's placements, else the sharding solver's for its tp and SP (cached per pair)."""
        if plan.placements:
            return plan.placements
        sp = plan.sequence_parallel and plan.tp > 1
        if (plan.tp, sp) not in self._solved_placements:
            if self.placement_solver is None:
                raise UserError(f"plan for tp={plan.tp} has no placements and this cost model has no placement "
                                f"solver; give the plan its placements (or build the cost model with "
                                f"autoparallel.sharding.cost_model)")
            self._solved_placements[plan.tp, sp] = self._runnable(self.placement_solver(plan.tp, sp), plan.tp)
        return self._solved_placements[plan.tp, sp]

    @property
    def has_fused_attention(self) -> bool:
        """Whether the blocks attend through fused SDPA kernels, which context parallelism rings."""
        segs = self.segments({}, False)
        return any(s.attn_kv_bytes > 0 for s in segs.values())

    @cached_property
    def sequence_splits(self) -> bool:
        """Whether sequence parallelism can shard the blocks' residual stream (facts.flattens_tokens)."""
        return not flattens_tokens(self.graph)

    def vocab_splits_evenly(self, tp: int) -> bool:
        """Whether the vocabulary divides tp. When it does not, the trainer keeps the embedding and LM
        head replicated, which it supports only without sequence parallelism."""
        return not self.vocab_size or self.vocab_size % tp == 0

    def _runnable(self, placements: dict[str, str], tp: int) -> dict[str, str]:
        """The trainer shards evenly: a vocabulary the solver would split unevenly (GPT-2's 50257 rows
        at tp > 1) stays replicated, and so does a fused projection whose pieces (q, k, v) do not each split
        into whole heads over tp, with the Linears beside it in its module (the attention's output
        projection: a head split of one would hand the other mismatched heads), and so does a module holding a
        convolution or run without autograd, its norms included (facts.convolution_mixers, no_grad_modules). The
        trainer's own head rules keep a module's Linears whole too, by the predicates it checks (cost_models.facts):
        a column split that would cut heads (ParamOp.heads, splits_whole_heads: tensor_parallel._check_heads;
        Kimi Linear's one-head f_a_proj) and a norm that sees the split heads of a column-split sibling and spans
        all of them (sees_split_heads, spans_split_heads: _check_per_head; Moss's projector norm) or that the
        trainer would run head-parallel on a whole input (a producer not a column-split sibling). So every plan
        the planner emits is one the trainer runs."""
        out = dict(placements)
        ops = self.graph.parametric_ops
        mixers = convolution_mixers(self.graph) | no_grad_modules(self.graph)
        whole = set(mixers)
        cols = self._colwise_features(placements)
        for path, pl in placements.items():
            op = ops.get(path)
            rows = op.in_features if op is not None and op.kind == "embedding" else (op.out_features if op else None)
            if pl in ("vocab", "colwise") and rows and rows % tp:
                out[path] = "replicate"
            if pl == "colwise" and op is not None and op.fused_pieces and \
                    any(p % (op.fused_unit * tp) for p in op.fused_pieces):
                whole.add(path.rpartition(".")[0])
            if pl == "colwise" and op is not None and not splits_whole_heads(op.heads, tp):
                whole.add(path.rpartition(".")[0])
        producers: dict[str, set[str]] = {}
        for a, b in self.graph.param_op_edges:
            producers.setdefault(b, set()).add(a)
        for path, op in ops.items():
            parent, split = path.rpartition(".")[0], cols.get(path.rpartition(".")[0], ())
            if not (op.norm_like and parent and split and sees_split_heads(op.normalized, split)):
                continue
            # the trainer runs it head-parallel (on dim 2, the heads of a [b, s, heads, d] view): right only on the
            # per-head output of a column-split sibling, not on a whole one (Ergo's shared-expert norm after its
            # row-parallel down_proj)
            width = next(iter(op.shapes.values()))[0]
            per_head = all(placements.get(a) == "colwise" and a.rpartition(".")[0] == parent
                           and (ops[a].out_features or 0) % width == 0 for a in producers.get(path, ()) if a in ops)
            if spans_split_heads(width, split) or not per_head:
                whole.add(parent)
        for path in placements:
            op = ops.get(path)
            parent = path.rpartition(".")[0]
            if op is not None and parent in whole and (op.kind == "linear" or op.kind == "norm" and parent in mixers):
                out[path] = "replicate"
        return out

    def _colwise_features(self, placements: dict[str, str]) -> dict[str, list[tuple[int, int] | None]]:
        """(in, out) features of each column-split module by parent module (None: not a Linear), as the trainer's
        head rules read its siblings (facts.sees_split_heads, spans_split_heads)."""
        cols: dict[str, list[tuple[int, int] | None]] = {}
        for path, pl in placements.items():
            if pl == "colwise":
                op = self.graph.parametric_ops.get(path)
                feats = (op.in_features, op.out_features) if op is not None and op.kind == "linear" else None
                cols.setdefault(path.rpartition(".")[0], []).append(feats)
        return cols

    def sp_refusal(self, placements: dict[str, str]) -> str | None:
        """Why the trainer cannot run `placements` under sequence parallelism, None where it can
        (trainer.tensor_parallel.apply_tensor_parallel): a norm-like module on the sequence-sharded stream runs
        there only as a 'sequence' norm; a replicated one outside a replicated branch of a block, not among split
        heads (facts.sees_split_heads), would sum no gradient over the shards, which the trainer refuses (Ergo's
        residual gate, a norm-like vector that takes two inputs)."""
        ops = self.graph.parametric_ops
        blocks = {op.block for op in ops.values() if op.block}
        regions = replicated_regions(placements, blocks, lambda p: p in ops and ops[p].norm_like)
        cols = self._colwise_features(placements)
        for path, pl in placements.items():
            op = ops.get(path)
            parent = path.rpartition(".")[0]
            if pl != "replicate" or op is None or not op.norm_like or any(path.startswith(r + ".") for r in regions):
                continue
            if not (parent and sees_split_heads(op.normalized, cols.get(parent, ()))):
                return f"{path} ({op.module_class}) is a norm-like module the sequence-sharded stream would keep whole"
        return None

    def virtual_stage_segments(self, plan: Plan) -> list[list[tuple[str, str, str]]]:
        """(segment name, recompute, fp8 recipe) per virtual stage, in order (the embedding and LM head
        stay in high precision, as torchtitan keeps them)."""
        stage_layers = plan.stage_layers or balanced_stages(self.num_blocks, plan.pp * plan.vpp)
        recompute = plan.recompute or ("none",) * self.num_blocks
        fp8 = getattr(plan, "fp8", ()) or ("none",) * self.num_blocks
        out, i = [], 0
        for v, n in enumerate(stage_layers):
            segs = [("pre", "none", "none")] if v == 0 else []
            segs += [(self.block_rep(j), recompute[j], fp8[j]) for j in range(i, i + n)]
            i += n
            if v == len(stage_layers) - 1:
                segs.append(("post", "none", "none"))
            out.append(segs)
        return out

    def stage_costs(self, plan: Plan) -> list[dict]:
        placements = self.placements_for(plan)
        sp = plan.sequence_parallel and plan.tp > 1
        key = self.segments_key(placements, sp)
        span = plan.mesh_span()
        p, v, m = plan.pp, plan.vpp, plan.num_micro_batches
        segs = self.segments(placements, sp)
        stage_segments = self.virtual_stage_segments(plan)
        zero_bubble = getattr(plan, "pipeline_schedule", "") == "zero_bubble"
        stages = []
        for d in range(p):
            acc = dict(time=0.0, compute=0.0, tp_comm=0.0, ep_comm=0.0, cp_comm=0.0, recompute=0.0, p2p=0.0,
                       flops_model=0.0, flops_hw=0.0, bwd=0.0, fwd_bwd=0.0, units=0, fwd=0.0, wgrad=0.0,
                       w_action=0.0, lead=0.0, idle=0.0)
            act = working = 0.0
            dense = tp_params = expert = 0.0
            root = 0.0  # the rank's root FSDP unit: the embedding, final norm and head it holds
            for vs, seg_list in enumerate(stage_segments):
                if vs % p != d:
                    continue
                for name, rc, f8 in seg_list:
                    c = self.segment_cost(key, name, plan.tp, plan.ep, sp, plan.micro_batch, rc,
                                          span["tp"], span["ep"], plan.compile, plan.cp, span["cp"], f8)
                    acc["time"] += c.total_s
                    acc["lead"] += c.lead_s
                    acc["idle"] += c.idle_s
                    acc["bwd"] += c.bwd_s
                    acc["fwd_bwd"] += c.fwd_s + c.bwd_s
                    acc["fwd"] += c.fwd_s
                    acc["wgrad"] += c.wgrad_s
                    acc["tp_comm"] += c.tp_comm_s
                    acc["ep_comm"] += c.ep_comm_s
                    acc["cp_comm"] += c.cp_comm_s
                    acc["recompute"] += c.recompute_s
                    acc["compute"] += c.total_s - c.tp_comm_s - c.ep_comm_s - c.cp_comm_s - c.recompute_s
                    acc["flops_model"] += c.flops_fwd + c.flops_bwd
                    acc["flops_hw"] += c.flops_fwd + c.flops_bwd + c.flops_recompute
                    act += c.act_bytes
                    working = max(working, c.working_bytes)
                    s = segs[name]
                    dense += s.dense_params
                    tp_params += s.tp_params
                    expert += s.expert_params
                    if name in ("pre", "post"):
                        root += s.dense_params + s.tp_params / plan.tp + s.expert_params / plan.ep
                    acc["units"] += self.fsdp_units(s, plan)
                if p > 1:
                    t = self.boundary_time(plan, span["pp"])
                    acc["time"] += t
                    acc["p2p"] += t
                    if zero_bubble:  # the schedule's third action per micro-batch and stage, W's host work
                        acc["time"] += self.host.pipeline_action_s
                        acc["p2p"] += self.host.pipeline_action_s
                        acc["w_action"] += self.host.pipeline_action_s
            params = dense + tp_params / plan.tp + expert / plan.ep
            acc["params"] = params
            # the boundary term is a send each way: the activation's rides on F, its gradient's on I
            f = acc["fwd"] + (acc["p2p"] - acc["w_action"]) / 2
            w = acc["wgrad"] + acc["w_action"]
            acc["rank_times"] = RankTimes(fwd_s=f, input_grad_s=acc["time"] - f - w, weight_grad_s=w)
            acc["expert_params"] = expert / plan.ep
            in_flight = in_flight_micro_batches(d, p, v, m)
            if zero_bubble:
                # rank d defers the W of d micro-batches past their I (torch's num_1f1b_microbatches = rank),
                # and a deferred W keeps its micro-batch's whole graph alive (stage_backward_input runs with
                # retain_graph: even a saved tensor only I needs lives until W, tests/test_zero_bubble.py
                # test_a_deferred_weight_gradient_keeps_its_graph_alive). So every rank holds what rank 0 does,
                # ZB-H1's peak (1F1B's) now on every rank; on a GPU: benchmarks/zero_bubble_h200.py
                in_flight = max(in_flight, in_flight_micro_batches(0, p, v, m))
            acc["memory"] = self._memory(plan, params, acc["expert_params"], act * in_flight, working,
                                         is_last=(d == (plan.pp * plan.vpp - 1) % p), root_params=root)
            stages.append(acc)
        return stages

    def max_block_params(self, plan: Plan) -> float:
        """Parameters of the largest block as held by one tp/ep rank (unsharded by ZeRO)."""
        segs = self.segments(self.placements_for(plan), plan.sequence_parallel and plan.tp > 1)
        reps = {self.block_rep(i) for i in range(self.num_blocks)}
        return max(segs[r].dense_params + segs[r].tp_params / plan.tp + segs[r].expert_params / plan.ep
                   for r in reps)

    def boundary_time(self, plan: Plan, pp_span: str) -> float:
        """Per micro-batch and virtual stage of a pipeline [s]: the activation sent forward and its
        gradient sent back, and the schedule's host work for the stage's forward and backward actions."""
        return 2 * send_recv_time(self._boundary_bytes(plan), link_for(self.profile, pp_span)) + \
            2 * self.host.pipeline_action_s

    def _boundary_bytes(self, plan: Plan) -> float:
        """Activation tensor crossing a stage boundary: the block input (b*s*h*2), /tp under SP, /cp."""
        segs = self.segments(self.placements_for(plan), plan.sequence_parallel and plan.tp > 1)
        block = self.block_rep(0)
        return segs[block].input_bytes * plan.micro_batch / (plan.tp if plan.sequence_parallel else 1) / plan.cp

    def _memory(self, plan: Plan, params: float, expert_params: float, act: float, working: float,
                is_last: bool, root_params: float = 0.0) -> dict[str, float]:
        """Bytes per device: ZeRO-sharded model states, activations, buffers (see module docstring), and where
        the end of the backward holds more (`reduce_peak`), that excess as "reduce"."""
        pd, gd, od = self.model_states(plan, params - expert_params, expert_params)
        logits = self.logits_bytes(plan) if is_last else 0.0
        buffers = self.gathered_bytes(plan) + logits  # fp32 logits and their gradient (vocab-sharded under TP)
        # A recomputed block's working set lives during that block's backward, after the loss backward
        # has freed the logits buffers: the peak holds the larger of the two, not both.
        working = max(0.0, working - logits)
        mem = {"params": pd, "grads": gd, "optimizer": od, "activations": act,
               "working": working, "buffers": buffers}
        mem["reduce"] = max(0.0, self.reduce_peak(plan, params - expert_params, expert_params, root_params)
                            - sum(mem.values()))
        mem["allocator"] = ALLOCATOR_RESERVE * sum(mem.values())
        return mem

    def gathered_bytes(self, plan: Plan) -> float:
        """ZeRO-3's gathered parameters of two blocks (the current and the prefetched one), per device."""
        if self.held_zero(plan) < 3:
            return 0.0
        return 2 * self.max_block_params(plan) * DTYPE_BYTES.get(plan.param_dtype, 2)

    def reduce_peak(self, plan: Plan, dense: float, expert: float, root_params: float) -> float:
        """Bytes per device as the trainer's backward ends: the activations are gone, every gradient exists (with
        one micro-batch too, where `grads_resident` leaves them out of the activation peak), and FSDP2 reduces
        the last units (foreach_reduce): the largest unit's gradients, unsharded, in the reduce dtype (the
        reduce-scatter input, kept alive until the next unit's reduce) beside its reduced shard. On an H200,
        one micro-batch of 4 x 4096 tokens (s112, s114): MiniMax-M2's single layer (3.66B parameters) peaked at
        93.1 GiB where the activation peak says 80.3 (this: 95.7), DBRX's (3.26B) at 86.8 against 74.2 (87.4),
        Solar Open's two layers (2.08B each) at 102.7 against 97.2 (105.3). `dense`, `expert`: the rank's
        local parameters; `root_params`: its root unit's (the embedding, final norm and head it holds). 0 for
        Megatron-LM, whose gradients live in one persistent buffer (`grads_resident`) reduced in place."""
        if self.runtime != "trainer":
            return 0.0
        states = sum(self.model_states(plan, dense, expert, grads=True))
        return states + self.gathered_bytes(plan) + self.reduce_buffer_bytes(plan, root_params)

    def reduce_buffer_bytes(self, plan: Plan, root_params: float) -> float:
        """The largest FSDP unit's reduce-scatter input on a rank: its block or root unit's parameters, as one
        tp/ep rank holds them, in the gradient reduce dtype (`reduce_peak`)."""
        return GRAD_STATE_BYTES.get(plan.grad_reduce_dtype, 4) * max(self.max_block_params(plan), root_params)

    def model_states(self, plan: Plan, dense: float, expert: float, grads: bool = False) -> tuple[float, float, float]:
        """(parameter, gradient, optimizer) bytes per device of `dense` and `expert` local parameters at the
        step's activation peak: model_state_bytes under the ZeRO mode the peak holds (`held_zero`), dense
        parameters sharded over the dense data-parallel group, expert ones over theirs; `grads`: with every
        gradient, as the backward ends (`reduce_peak`). The planner prices blocks by it."""
        gb = GRAD_STATE_BYTES.get(plan.grad_reduce_dtype, 4)
        gb = gb if grads or self.grads_resident(plan.num_micro_batches) else 0
        ps, zero = self.param_state_bytes(plan), self.held_zero(plan)
        d = model_state_bytes(dense, zero, plan.dense_dp, ps, gb)
        e = model_state_bytes(expert, zero, plan.expert_dp, ps, gb)
        return d[0] + e[0], d[1] + e[1], d[2] + e[2]

    def held_zero(self, plan: Plan) -> int:
        """The ZeRO mode whose model states the step's memory peak holds: the plan's, except under the trainer's
        pipeline with several micro-batches, where every FSDP2 unit stays unsharded, its gradients accumulating
        unsharded, from its first backward to the step's one reduction (comm.trainer_dp_schedule): ZeRO 2 and 3
        then hold ZeRO-1's states, as torchtitan's pipelined FSDP (reshard_after_forward off) does by design.
        ZeRO-3's gathered stage lives from a backward to the next forward, which reshards it unit by unit while
        the activations grow back, so counting it whole overstates the peak by at most one micro-batch of the
        stage's activations."""
        if self.runtime == "trainer" and plan.pp > 1 and plan.num_micro_batches > 1:
            return min(plan.zero, 1)
        return plan.zero

    def param_state_bytes(self, plan: Plan) -> int:
        """Bytes per parameter that model_state_bytes counts as the parameters: the compute-dtype copy.
        Under the trainer's ZeRO-3 with mixed precision (FSDP2, reshard_after_forward) that copy exists
        only while a unit is gathered (the buffers above); what persists is the fp32 master shard,
        counted with the optimizer state (measured on two H200s, s5: both ZeRO-3 runs of the 1.3B had been
        over-predicted by 1.2 GiB, its bf16 parameters over two ranks)."""
        pb = DTYPE_BYTES.get(plan.param_dtype, 2)
        return 0 if self.runtime == "trainer" and self.held_zero(plan) >= 3 and pb < 4 else pb

    def grads_resident(self, micro_batches: int) -> bool:
        """Whether gradients occupy memory at the step's peak (the start of the last micro-batch's
        backward, when activations are largest). Megatron-LM keeps a persistent fp32 gradient buffer.
        The trainer frees gradients after each optimizer step (zero_grad(set_to_none=True)), so with one
        micro-batch they are born during the backward while activations are freed, and the peak holds
        none; with several, the earlier micro-batches' gradients are held (measured on an H200: 1.3B llama
        at 8 x 2048, 52.5 GiB allocated against 51.5 predicted without gradients, 56.3 with them)."""
        return self.runtime == "megatron" or micro_batches > 1

    def compiled_loss(self, compiled: bool, tp: int, cp: int) -> bool:
        """Whether the trainer compiles the default loss with the blocks (AutoParallelTrainer._setup: tp = cp
        = 1; under TP the loss is vocab-parallel, under CP it runs in the ring's context, both eager)."""
        return self.runtime == "trainer" and self.variant.compiles_loss and compiled and tp == 1 and cp == 1

    def loss_parallel(self, plan: Plan) -> bool:
        """Whether the trainer's default loss runs on vocab-sharded logits (torch's loss_parallel): tp > 1
        with the LM head, the last Linear after the blocks, column-sharded (trainer.tensor_parallel's
        lm_head_path)."""
        if self.runtime != "trainer" or plan.tp == 1 or self._head_path is None:
            return False
        return self.placements_for(plan).get(self._head_path) == "colwise"

    @cached_property
    def _head_path(self) -> str | None:
        """The LM head: the last Linear outside the blocks (None for a model without one)."""
        heads = [path for path, op in self.graph.parametric_ops.items() if op.block is None and op.kind == "linear"]
        return heads[-1] if heads else None

    def logits_bytes(self, plan: Plan) -> float:
        """The loss's buffers beyond its saved tensors (those are the post segment's activations), on the
        last stage (vocab-sharded under TP, sequence-split under CP) [bytes]: eager cross entropy's fp32
        copy of the logits and its fp32 gradient; under the trainer also the head's output itself, which
        its step holds until the backward is done (the model output it returned; Megatron computes the
        loss inside the model) though no backward op saves it. The trainer's compiled loss (one fused
        pass, `compiled_loss`) saves that output (counted with the activations) and makes only the
        gradient, in the logits' dtype; where the model's own ops scale the head's output (Cohere's
        logit_scale, Granite's logits_scaling, Gemma 2's soft-cap) the backward of the last of them makes the
        gradient of its input while the loss's is alive: two gradients at once (on an H200 Aya Expanse's
        compiled step peaked one logits-sized bf16 tensor above the single-gradient count)."""
        pb = DTYPE_BYTES.get(plan.param_dtype, 2)
        per_logit = 2 * 4 + (pb if self.runtime == "trainer" else 0)
        if self.compiled_loss(plan.compile, plan.tp, plan.cp):
            per_logit = pb * (2 if self.scales_logits else 1)
        elif self.loss_parallel(plan):
            # torch's loss_parallel fuses the NLL and log-softmax backward into (zeros_like(x) + exp(x)) *
            # grad (torch/distributed/tensor/parallel/loss.py, _nll_loss_and_log_softmax_backward): the
            # zeros, their sum with exp(x) and the product live at once, one fp32 tensor more than eager's
            per_logit += 4
        return per_logit * plan.micro_batch * plan.seq_len * self.vocab_size / plan.tp / plan.cp

    def update_rate_per_micro_batch(self, micro_batches: int) -> float:
        """Update seconds per parameter and micro-batch of one rank with m micro-batches (bf16 parameters,
        fp32 reduction, ZeRO-0): the sharding solver's per-parameter price of keeping a weight whole."""
        return self._update_seconds(1, 0, micro_batches, DTYPE_BYTES["bf16"], DTYPE_BYTES["fp32"]) / micro_batches

    def dp_schedule(self, zero: int, micro_batches: int, pp: int = 1) -> DpSchedule:
        """Per parameter unit and step, the runtime's parameter all-gathers and gradient reductions: FSDP2's
        under the trainer (comm.trainer_dp_schedule, which a pipeline changes), Megatron-LM's otherwise."""
        if self.runtime == "trainer":
            return trainer_dp_schedule(zero, micro_batches, pp > 1)
        return megatron_dp_schedule(zero, micro_batches)

    def dp_cover(self, plan: Plan, fwd_s: float, bwd_s: float) -> float:
        """Work that the data-parallel collectives of a step hide behind [s], from one micro-batch's forward and
        backward: a backward per reduction of the `dp_schedule` (the last micro-batch's where it reduces once),
        the forwards too where ZeRO-3 gathers and reduces every micro-batch."""
        sched = self.dp_schedule(plan.zero, plan.num_micro_batches, plan.pp)
        per = fwd_s + bwd_s if plan.zero >= 3 and sched.reductions == plan.num_micro_batches else bwd_s
        return per * sched.reductions

    def fsdp_collective_time(self, plan: Plan, units: int) -> float:
        """Per step, the host work at the FSDP2 collectives of `units` units that the host's lead can hide
        [s] (cost_models.host): the ranks meet at each collective of the unit's `dp_schedule` (its all-gathers,
        none under ZeRO-0's replicate, and its reductions); none when one rank holds everything. The optimizer
        term carries it (linear in the units, so the planner adds it per block)."""
        if plan.dense_dp == 1 or not self.host.fsdp_collective_s:
            return 0.0
        sched = self.dp_schedule(plan.zero, plan.num_micro_batches, plan.pp)
        per_unit = (sched.unshards if plan.zero >= 1 else 0) + sched.reductions
        return self.host.fsdp_collective_s * per_unit * units

    def fsdp_tensors(self, seg: Segment) -> int:
        """Parameter tensors FSDP2 handles for `seg` under the trainer, in its own units or the root's."""
        return seg.param_tensors if self.runtime == "trainer" else 0

    def tail_host_time(self, collective_s: float, lead_s: float) -> float:
        """The step's host work beyond its ops that the optimizer term carries [s]: the per-step work
        (optimizer launch, zero_grad, FSDP's root hooks, the loss read back: it starts with an idle GPU,
        after the previous step's read-back, so it is paid in full) and the visible part of the ranks'
        meetings at FSDP collectives (`fsdp_collective_time`): their host work less `lead_s`, how far the
        host ran ahead of the GPU by the end of the backward (m * the stage's SegmentCost.lead_s, the host
        never waiting for the GPU inside a step). A host-bound step (the calibration probes) pays them all,
        a GPU-bound one none: dp2 steps of a 1.3B llama took 10-15 ms more than its one-GPU steps on three
        VMs, against 30-43 ms of these meetings (docs/trainer_sweep_notes.md)."""
        return self.host.step_s + max(0.0, collective_s - lead_s)

    def optimizer_seconds_per_param(self, plan: Plan) -> float:
        """Optimizer step + gradient accumulation per step, per parameter a rank holds [s]
        (compute.update_time; linear in the parameters, so the planner can use it per block)."""
        return self._update_seconds(plan.dense_dp, plan.zero, plan.num_micro_batches,
                                    DTYPE_BYTES.get(plan.param_dtype, 2), GRAD_STATE_BYTES.get(plan.grad_reduce_dtype, 4),
                                    plan.pp)

    def _update_seconds_of(self, d: int, zero: int, micro_batches: int, pb: int, gb: int, pp: int = 1) -> float:
        """The runtime's update per local parameter: FSDP2's (compute.fsdp_update_time, over its `dp_schedule`)
        for the trainer, Megatron's (compute.update_time) otherwise; d = the data-parallel group size."""
        if self.runtime == "trainer":
            return fsdp_update_time(1.0 / (d if zero >= 1 else 1), d, self.dp_schedule(zero, micro_batches, pp),
                                    micro_batches, self.profile, pb, gb, clip=self.variant.clip_grad_norm)
        return update_time(1.0 / (d if zero >= 1 else 1), 1.0 / (d if zero >= 2 else 1), micro_batches, pb, gb,
                           self.profile)

    def _data_parallel_time(self, plan: Plan, stages: list[dict]) -> tuple[float, float, float, float]:
        """(exposed DP comm, its interference with the work it hides behind, total DP comm, optimizer step)
        per step [s]: the first two of the stage where their sum is largest, the others the largest.

        Dense parameters sync over dp*cp*ep ranks, expert parameters over dp*cp ranks (`dp_sync_time`). The
        sync hides behind backward work (exposed = max(0, t_sync - t_cover)): the last micro-batch's
        backward for ZeRO-0/1, every micro-batch's backward for ZeRO-2, all forward and backward work
        for ZeRO-3; recompute is not counted as cover, so more recompute never buys less exposure. What it
        hides behind runs slower beside it (comm.dp_overlap_cost, less the GPU's idle time in the stage's
        m micro-batches). The optimizer step and the per-micro-batch gradient accumulation: compute.update_time.
        """
        d_dense, d_exp = plan.dense_dp, plan.expert_dp
        gd = plan.grad_reduce_dtype
        pb = DTYPE_BYTES.get(plan.param_dtype, 2)
        qbw = self.quant_bandwidth()
        m = plan.num_micro_batches
        dense_link, exp_link = self.data_parallel_links(plan)
        worst = (0.0, 0.0)
        worst_total = worst_opt = 0.0
        for s in stages:
            dense, exp = s["params"] - s["expert_params"], s["expert_params"]
            sched = self.dp_schedule(plan.zero, m, plan.pp)
            total = dp_sync_time(dense, d_dense, dense_link, plan.zero, sched, gd, pb, qbw) + \
                dp_sync_time(exp, d_exp, exp_link, plan.zero, sched, gd, pb, qbw)
            window = self.dp_cover(plan, s["fwd"], s["bwd"]) if self.overlap_grad_sync else 0.0
            cost = dp_overlap_cost(total, window, m * s["idle"], self.interference)
            opt = s["params"] * self.optimizer_seconds_per_param(plan) + \
                self.tail_host_time(self.fsdp_collective_time(plan, s["units"]), m * s["lead"])
            worst = max(worst, cost, key=sum)
            worst_total, worst_opt = max(worst_total, total), max(worst_opt, opt)
        return worst[0], worst[1], worst_total, worst_opt

    def data_parallel_links(self, plan: Plan) -> tuple[Link, Link]:
        """The links of the dense parameters' sync group (dp x cp x ep ranks) and the expert parameters'
        (dp x cp), each inside a node or across nodes with its ranks per node (comm.link_for)."""
        span = plan.mesh_span()
        links = []
        for dims in (("dp", "cp", "ep"), ("dp", "cp")):
            inter = "inter" in (span[d] for d in dims)
            links.append(link_for(self.profile, "inter" if inter else "intra", plan.ranks_per_node(dims) if inter else 1))
        return links[0], links[1]

    def quant_bandwidth(self) -> float:
        """Bytes/s of the int8 quantize / dequantize passes: memory-bound elementwise casts, at the
        calibrated `cast` kernel fraction of the memory bandwidth."""
        return self.profile.memory_bandwidth * memory_fraction(self.profile, "cast")


def dp_sync_time(params: float, d: int, link, zero: int, schedule: DpSchedule, grad_dtype: str, param_bytes: int,
                 quant_bandwidth: float = float("inf")) -> float:
    """Data-parallel communication per step for `params` local parameters over d ranks [s]: the runtime's
    `schedule` of parameter all-gathers and gradient reductions (comm.trainer_dp_schedule,
    comm.megatron_dp_schedule); under ZeRO-0 the parameters are replicated and the reductions are
    all-reduces. Gradient reductions in `grad_dtype` (comm.gradient_reduce_time: int8 moves a quarter of
    fp32's bytes and pays its quantize/dequantize passes at quant_bandwidth).
    """
    if d <= 1 or params <= 0:
        return 0.0
    if zero == 0:
        return schedule.reductions * gradient_reduce_time("all_reduce", params, d, link, grad_dtype, quant_bandwidth)
    rs = gradient_reduce_time("reduce_scatter", params, d, link, grad_dtype, quant_bandwidth)
    return schedule.reductions * rs + schedule.unshards * all_gather_time(params * param_bytes, d, link)


def in_flight_micro_batches(d: int, p: int, v: int, m: int) -> float:
    """Micro-batches whose activations device d holds at its peak (in units of one micro-batch
    through all of d's layers). 1F1B: min(m, p - d); interleaved adds (p - 1)/v (Korthikanti 2022:
    the first stage's activations grow by 1 + (p-1)/(p v))."""
    if p == 1:
        return 1.0
    if v == 1:
        return float(min(m, p - d))
    return min(float(m), (p - d) + (p - 1) / v)


def balanced_stages(num_blocks: int, stages: int) -> tuple[int, ...]:
    base, extra = divmod(num_blocks, stages)
    return tuple(base + (1 if i < extra else 0) for i in range(stages))


def _divisors_upto(n: int, limit: int) -> str:
    return ", ".join(str(d) for d in range(1, min(n, limit) + 1) if n % d == 0)


def estimate(graph: OpGraph, cluster: Cluster, plan: Plan, max_memory_bytes: float | None = None,
             dtype: str = "bf16", overlap_grad_sync: bool = True, runtime: str = "trainer") -> Estimate:
    """Predict a plan's step time, throughput and memory (see the module docstring). A tp > 1 plan
    brings its placements; autoparallel.sharding.cost_model builds a CostModel that solves them."""
    return CostModel(graph, cluster, dtype, overlap_grad_sync, runtime).estimate(plan, max_memory_bytes)


__all__ = ["CostModel", "Estimate", "SegmentCost", "estimate", "balanced_stages", "in_flight_micro_batches"]
