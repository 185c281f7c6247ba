"""Host (CPU) time of the trainer's eager execution, beyond the per-op dispatch of `compute.host_floor`.

Eager PyTorch issues every kernel from the host. While the host stays ahead, the GPU queue hides its
work; when a phase's host work exceeds its kernels, the host sets the pace (`host_floor`). The
trainer's host work is more than the ops themselves: FSDP2 runs hooks around every unit (their cost
per unit is a near-constant share of its ops' and lands in the per-op rate), activation
checkpointing re-enters the autograd engine, per-op selective checkpointing runs a dispatch mode over
every op, tensor-parallel modules dispatch through DTensor, the pipeline schedule does bookkeeping per
action, and expert parallelism reads token counts back to the host before each all-to-all, which
drains the GPU queue. Each is one calibration term (microseconds), per unit of what it counts:

  host_us_per_op_dtensor        per op of a tensor-parallel step, on top of the plain per-op rate
  host_us_per_op_sac            per forward or recompute op of a block under per-op checkpointing (its dispatch
                                mode sees every op)
  host_us_per_sac_tensor        per parameter tensor of a block under per-op checkpointing, in its forward: the
                                FSDP2 parameters' views pass through the same mode. At 32 tokens a row the 20
                                families' forwards fit 36 us an op + 154 us a tensor (docs/host_mix.md "Under
                                recompute"), where a per-op rate alone had GPT-like blocks (16 tensors, 38 ops)
                                30% short and op-heavy ones (Gemma 3: 121 ops, 13 tensors) 60% long. The probes'
                                one per-op-checkpointed llama cannot tell the two apart: both are HELD_TERMS
  host_us_per_tp_collective     per tensor-parallel collective of an eager step (DTensor's redistribute in
                                Python: an all-reduce per rowwise output and colwise input gradient, or
                                under sequence parallelism a reduce-scatter and an all-gather each way)
  host_us_per_fsdp_collective   per FSDP2 all-gather or reduce-scatter of one unit over more than one rank:
                                the ranks meet at each collective, so whichever is behind holds the other;
                                counted per step (`CostModel.fsdp_collective_time`), less the host's lead
                                over a GPU-bound backward (`CostModel.tail_host_time`)
  host_us_per_fsdp_tensor       per parameter tensor of an FSDP2 unit and micro-batch, on any number of ranks
                                (the trainer shards with FSDP2 on one GPU too) and in every ZeRO mode: the
                                hooks loop over the unit's tensors before the forward (unshard: the copy-in
                                views, the unsharded parameters set on the modules) and after the backward
                                (the gradients accumulated in fp32, or reduced, then reshard). Half is host
                                work of the segment's forward phase, half of its backward, compiled blocks
                                included (the hooks run outside the graph). A tiny llama with a bias on every
                                projection (16 tensors a block to 9, the same GEMMs) took 0.53 ms more per
                                block forward on one VM (benchmarks/host_rate.py)
  host_us_per_checkpoint        per checkpointed region (a block under full/op, the attention core under
                                selective) per micro-batch, charged to the backward phase that recomputes it
  host_us_per_recompute_op      per op the region re-runs, on top of the replay's own rate (the dense forward
                                rate, expert blocks too: CostModel._phase_times' replay) for saved-tensor
                                unpacking and the replayed module calls: a whole-block replay costs more host
                                than an attention-core one
  host_us_per_pipeline_action   per forward or backward action of one virtual stage on one micro-batch
  host_us_per_ep_sync           per forward of an expert-parallel MoE layer: the device-to-host read of the
                                token counts; added to the time (the GPU idles while the host refills its queue)
  host_us_per_step              per step: optimizer launch, zero_grad, FSDP's root hooks, the loss read back
  host_us_per_compiled_call     per phase of a compiled block per micro-batch: the graph call's guards and
                                wrappers and its fused kernels' launches (compute.compiled_host_floor). Per
                                call, not per traced op: at 32 tokens a row the compiled blocks of six
                                families took 1.7-2.6 ms of host a forward and 1.3-1.8 ms a backward whether
                                they traced 38 ops (GPT) or 121 (Gemma 3), their eager forwards 1.3-3.5 ms
                                (benchmarks/host_mix.py, docs/host_mix.md); per traced op, Gemma 3's compiled
                                step was predicted host-paced at 542 ms and ran GPU-paced at 293
  host_us_per_compiled_launch   per kernel a compiled block launches in a phase (graph.Launches: its library
                                kernels, fused groups and split reductions), on top of the call: Inductor's
                                launcher and buffer handling around each. The probes cannot fit it (their two
                                compiled blocks launch about as many kernels); a GPT block's backward, which
                                launches 17 more at 16384 tokens a micro-batch than at 32 (its norm and bias
                                gradients split, cuBLAS's split-K), sets it: a HELD_TERMS entry, measured
                                (benchmarks/host_mix.py --launches, profile_timeline.py --regions-of)

Profiles without these keys (every uncalibrated one) charge nothing for them. `autoparallel calibrate
--trainer` fits them, with the per-op rates, from AutoParallelTrainer's own steps on small host-bound
models (autoparallel/calibrate_trainer.py). They describe the host CPU, which differs between machines
of the same accelerator (up to 2x between lent H200 VMs), mostly by one factor on all of them: `calibrate
--trainer --rescale` measures that factor where the trainer runs (three probes) and scales a fitted profile's
terms by it (docs/host_transfer.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_profiles import HardwareProfile
from hardware_profiles.errors import UserError

# calibration keys `calibrate --trainer` fits from its probes, and the HostTerms field each sets
HOST_TERMS = ("host_us_per_op_dtensor", "host_us_per_tp_collective", "host_us_per_fsdp_collective", "host_us_per_checkpoint",
              "host_us_per_recompute_op", "host_us_per_pipeline_action", "host_us_per_ep_sync", "host_us_per_step",
              "host_us_per_compiled_call", "host_us_per_fsdp_tensor")
# keys measured per block (benchmarks/host_mix.py), which the probes cannot tell apart: per-op checkpointing's
# work per op and per parameter tensor (the probes hold one per-op-checkpointed llama, whose two counts move
# together), and a compiled block's host work per kernel beside its call (the two compiled probes launch about as
# many kernels a block, 38 and 35 a micro-batch). The profile's values are held when `calibrate --trainer` fits
# the others; `--rescale` scales them with the rest
HELD_TERMS = ("host_us_per_op_sac", "host_us_per_sac_tensor", "host_us_per_compiled_launch")
_FIELD = {"host_us_per_op_dtensor": "dtensor_op_s", "host_us_per_op_sac": "sac_op_s",
          "host_us_per_tp_collective": "tp_collective_s", "host_us_per_fsdp_collective": "fsdp_collective_s",
          "host_us_per_checkpoint": "checkpoint_s", "host_us_per_recompute_op": "recompute_op_s",
          "host_us_per_pipeline_action": "pipeline_action_s", "host_us_per_ep_sync": "ep_sync_s",
          "host_us_per_step": "step_s", "host_us_per_compiled_call": "compiled_call_s",
          "host_us_per_compiled_launch": "compiled_launch_s",
          "host_us_per_fsdp_tensor": "fsdp_tensor_s", "host_us_per_sac_tensor": "sac_tensor_s"}

# calibration keys of earlier profiles whose unit changed -> the key that replaced them
RETIRED = {"host_us_per_op_compiled": "host_us_per_compiled_call"}  # per traced op -> per graph call (s36)


def _us(profile: HardwareProfile, key: str) -> float:
    value = profile.calibration.get(key) if profile.calibration else None
    return float(value) * 1e-6 if isinstance(value, (int, float)) and value > 0 else 0.0


@dataclass(frozen=True)
class HostTerms:
    """The host terms above, in seconds (0 where the profile has no value)."""
    dtensor_op_s: float = 0.0
    sac_op_s: float = 0.0
    tp_collective_s: float = 0.0
    fsdp_collective_s: float = 0.0
    checkpoint_s: float = 0.0
    recompute_op_s: float = 0.0
    pipeline_action_s: float = 0.0
    ep_sync_s: float = 0.0
    step_s: float = 0.0
    compiled_call_s: float = 0.0
    compiled_launch_s: float = 0.0
    fsdp_tensor_s: float = 0.0
    sac_tensor_s: float = 0.0

    @classmethod
    def of(cls, profile: HardwareProfile) -> HostTerms:
        cal = profile.calibration or {}
        for old, new in RETIRED.items():
            if old in cal and new not in cal:  # dropped silently, the profile's fitted host work would vanish
                raise UserError(f"hardware profile {profile.name!r}: calibration.{old} is no longer read (its "
                                f"unit changed: {new}); refit it with `autoparallel calibrate --trainer --fit "
                                f"PROBES --base h200 --output FILE` (or --rescale), or delete the entry")
        return cls(**{_FIELD[k]: _us(profile, k) for k in HOST_TERMS + HELD_TERMS})
