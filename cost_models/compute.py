"""Compute time of one operator: a roofline with size-dependent efficiency.

    t_op = max( F / (P_peak * e_gemm(F)),  Bytes / (BW_mem * e_mem) ) + t_launch      [seconds]

F in FLOPs, P_peak in FLOP/s for the compute dtype, Bytes moved to/from device memory, BW_mem in
bytes/s. Matmul-class ops (mm, bmm, attention kernels, grouped expert GEMMs) reach
e_gemm(F) = gemm_max * F / (F + gemm_half_flops): small GEMMs cannot fill the machine, large ones
approach gemm_max. Other ops are bandwidth-bound at e_mem = memory_bound.
"""

from __future__ import annotations

import numpy as np

from hardware_profiles import HardwareProfile

# aten ops whose FLOPs run on matrix units (tensor cores); all others are treated as vector/memory ops.
MATMUL_OPS = ("mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "convolution", "_grouped_mm",
              "scaled_dot_product", "flash_attention", "efficient_attention", "cudnn_attention")


def is_matmul(op_name: str) -> bool:
    base = op_name.split(".")[1] if op_name.startswith("aten.") else op_name
    return any(base.startswith(m) or m in base for m in MATMUL_OPS)


def gemm_efficiency(flops: np.ndarray | float, profile: HardwareProfile) -> np.ndarray | float:
    """e_gemm(F) = gemm_max * F / (F + gemm_half_flops)   (dimensionless, F in FLOPs)."""
    eff = profile.efficiency
    return eff.gemm_max * flops / (flops + eff.gemm_half_flops)


def op_times(flops: np.ndarray, bytes_moved: np.ndarray, matmul: np.ndarray, profile: HardwareProfile,
             dtype: str) -> np.ndarray:
    """Vectorized roofline time per op [s]; see the module docstring for the formula."""
    peak = profile.peak(dtype)
    eff = profile.efficiency
    with np.errstate(divide="ignore", invalid="ignore"):
        e = np.where(matmul, gemm_efficiency(np.maximum(flops, 1.0), profile), eff.gemm_max)
        t_compute = np.where(flops > 0, flops / (peak * e), 0.0)
    t_memory = bytes_moved / (profile.memory_bandwidth * eff.memory_bound)
    launch = np.where((flops > 0) | (bytes_moved > 0), eff.kernel_overhead_s, 0.0)
    return np.maximum(t_compute, t_memory) + launch
