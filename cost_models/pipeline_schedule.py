"""Pipeline makespan of one training step from per-rank micro-batch times (seconds), by schedule.

Each pipeline rank d runs, per micro-batch through all its virtual stages, a forward F_d, an
input-gradient backward I_d (recompute included: it runs before the first gradient) and a weight-gradient
backward W_d (the weight-gradient GEMMs of its linears); T_d = F_d + I_d + W_d. With m micro-batches, p
ranks and v virtual stages per rank, k the slowest rank:

  1F1B / interleaved 1F1B (Narayanan et al. 2021; torch Schedule1F1B, ScheduleInterleaved1F1B):
      t = m T_k + (sum_d T_d - T_k) / v                       bubble (p-1) T / v when balanced
  zero bubble, torch's ScheduleInterleavedZeroBubble (Qi et al. 2024, arXiv 2401.10241: its ZB-H1 at
  v = 1, "ZB1P"; the interleaved variant at v > 1): each W is deferred into the cool-down, where it fills
  the wait for the next input gradient, so a hop of the pipeline costs b_d = F_d + I_d - min(F_d, I_d, W_d)
  instead of T_d:
      t = m T_k + (sum_d b_d - b_k) / v                       bubble (p-1)(F + I - W) / v when balanced
                                                              and W <= F, I (the paper's ZB-H1 figure)
The min: a W longer than F or I cannot hide more than the slot it fills. Both are exact for identical
stages against a simulation of torch's own action lists (tests/test_zero_bubble.py, any F/I/W); for
uneven stages they are the same approximation, both lying between the identical-stage pipelines of the
fastest and the slowest stage.
"""

from __future__ import annotations

from dataclasses import dataclass

SCHEDULES = ("", "zero_bubble")  # Plan.pipeline_schedule: "" = 1F1B, interleaved by vpp


@dataclass(frozen=True)
class RankTimes:
    """One pipeline rank's work per micro-batch through all its virtual stages [s]."""
    fwd_s: float
    input_grad_s: float
    weight_grad_s: float

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.input_grad_s + self.weight_grad_s

    @property
    def zero_bubble_hop_s(self) -> float:
        """What one pipeline hop of warm-up and cool-down costs under zero bubble (module docstring)."""
        return self.fwd_s + self.input_grad_s - min(self.fwd_s, self.input_grad_s, self.weight_grad_s)


def pipeline_time(schedule: str, ranks: list[RankTimes], m: int, v: int) -> float:
    """Makespan of m micro-batches through the pipeline ranks `ranks` (v virtual stages each) [s]."""
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown pipeline schedule {schedule!r}")
    totals = [r.total_s for r in ranks]
    k = max(range(len(ranks)), key=totals.__getitem__)
    hops = [r.zero_bubble_hop_s for r in ranks] if schedule == "zero_bubble" else totals
    return m * totals[k] + (sum(hops) - hops[k]) / v
