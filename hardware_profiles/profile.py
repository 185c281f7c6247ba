"""Hardware profile and cluster dataclasses. All values are SI: FLOP/s, bytes, bytes/s, seconds."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from hardware_profiles.errors import UserError

# Spellings accepted by HardwareProfile.peak(): canonical profile key <- aliases (torch dtype names too).
DTYPE_ALIASES: dict[str, str] = {
    "bf16": "bf16", "bfloat16": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16",
    "fp32": "fp32", "float32": "fp32", "float": "fp32",
    "tf32": "tf32",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
    "fp8": "fp8", "float8_e4m3fn": "fp8", "float8_e5m2": "fp8", "float8_e4m3fnuz": "fp8",
    "float8_e5m2fnuz": "fp8",
    "fp6": "fp6", "fp4": "fp4", "int8": "int8",
}
# When a device has no peak for a dtype, the nearest substitute the framework actually runs:
# bf16 on a device without bf16 units (V100) is computed in fp16 by autocast-style fallbacks, and the
# same in reverse; TF32 matmuls fall back to plain fp32 on devices without TF32 tensor cores.
DTYPE_FALLBACK: dict[str, str] = {"bf16": "fp16", "fp16": "bf16", "tf32": "fp32"}


@dataclass(frozen=True)
class Efficiency:
    """Achieved fractions of the peaks, used by the cost model.

    gemm_max          achievable fraction of peak FLOP/s on large GEMMs
    gemm_half_flops   GEMM size (FLOPs) at which the achieved fraction is gemm_max / 2
    memory_bound      achieved fraction of memory bandwidth on bandwidth-bound ops
    collective_intra  achieved bus-bandwidth fraction of the intra-node link
    collective_inter  achieved bus-bandwidth fraction of the inter-node NIC
    kernel_overhead_s fixed launch/scheduling cost per kernel, seconds
    """

    gemm_max: float
    gemm_half_flops: float
    memory_bound: float
    collective_intra: float
    collective_inter: float
    kernel_overhead_s: float

    def gemm(self, flops: float) -> float:
        """Achieved fraction of peak for a GEMM of `flops` FLOPs (dimensionless).

        eff(F) = gemm_max * F / (F + gemm_half_flops): a saturating curve, small GEMMs cannot fill the
        device (too few tiles per SM, launch and tail effects), large ones approach gemm_max.
        """
        if flops <= 0:
            return self.gemm_max
        return self.gemm_max * flops / (flops + self.gemm_half_flops)


@dataclass(frozen=True)
class HardwareProfile:
    name: str
    vendor: str
    model: str
    peak_flops: dict[str, float]          # dtype key (bf16, fp16, fp32, tf32, fp8, ...) -> FLOP/s, dense
    memory_bytes: int                     # vendor capacity, bytes
    usable_fraction: float                # of memory_bytes usable by the framework
    memory_bandwidth: float               # bytes/s
    devices_per_node: int
    intra_link: str
    intra_bandwidth: float                # bytes/s per device, per direction
    intra_latency: float                  # s
    inter_bandwidth: float                # bytes/s per device, per direction
    inter_latency: float                  # s
    collective_library: str
    torch_backend: str                    # torch.distributed backend name
    torch_device: str                     # torch device type
    efficiency: Efficiency
    confidence: str                       # high | medium | low
    notes: str = ""
    sources: tuple[str, ...] = ()
    path: str | None = None               # file it was loaded from; None when built in memory
    calibration: dict[str, Any] = field(default_factory=dict, compare=False)  # free-form, from calibrate
    # efficiency key -> "measured" | "derived from NAME" | "assumed" (loader._apply_derivation)
    provenance: dict[str, str] = field(default_factory=dict, compare=False)

    def __hash__(self) -> int:
        # The generated hash would fail on the peak_flops dict; equal profiles agree on these fields,
        # so profiles (and Clusters) can key caches.
        return hash((self.name, self.model, self.memory_bytes, tuple(sorted(self.peak_flops.items()))))

    def resolve_dtype(self, dtype: object) -> str:
        """The peak_flops key used for `dtype` (a name like 'bf16' or a torch.dtype), after fallbacks."""
        text = str(dtype).removeprefix("torch.").lower()
        key = DTYPE_ALIASES.get(text)
        if key is None:
            raise UserError(f"hardware profile {self.name}: unknown dtype {dtype!r}; use one of "
                            f"{', '.join(sorted(set(DTYPE_ALIASES.values())))}")
        if key in self.peak_flops:
            return key
        fallback = DTYPE_FALLBACK.get(key)
        if fallback in self.peak_flops:
            return fallback
        raise UserError(f"hardware profile {self.name}: no {key} peak (the {self.model} lists "
                        f"{', '.join(sorted(self.peak_flops))}); pick one of those dtypes")

    def peak(self, dtype: object) -> float:
        """Dense peak FLOP/s for `dtype`. bf16 on a device without bf16 (V100) uses the fp16 peak,
        fp16 without fp16 uses bf16, tf32 without tf32 uses fp32 (see resolve_dtype)."""
        return self.peak_flops[self.resolve_dtype(dtype)]

    @property
    def usable_memory_bytes(self) -> int:
        """Bytes the framework can allocate: capacity * usable_fraction (driver/context reserve off)."""
        return int(self.memory_bytes * self.usable_fraction)


@dataclass(frozen=True)
class Cluster:
    """A profile and a device count: num_devices devices, devices_per_node of them per node.

    devices_per_node defaults to the profile's node shape; an override models e.g. 4-GPU nodes of a
    part usually sold in 8s. A cluster larger than one node must fill whole nodes.
    """

    profile: HardwareProfile
    num_devices: int
    devices_per_node: int | None = None

    def __post_init__(self) -> None:
        n = self.num_devices
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise UserError(f"cluster: device count {n!r} must be a positive integer (e.g. --gpus 8)")
        per_node = self.profile.devices_per_node if self.devices_per_node is None else self.devices_per_node
        if isinstance(per_node, bool) or not isinstance(per_node, int) or per_node < 1:
            raise UserError(f"cluster: devices per node {per_node!r} must be a positive integer "
                            f"(e.g. --gpus-per-node 8)")
        if n > per_node and n % per_node:
            raise UserError(f"cluster: {n} devices do not fill whole nodes of {per_node} "
                            f"({self.profile.name}); use a multiple of {per_node} or set devices per node")
        object.__setattr__(self, "devices_per_node", per_node)

    @property
    def num_nodes(self) -> int:
        return math.ceil(self.num_devices / self.devices_per_node)

    @property
    def devices_in_node(self) -> int:
        """Devices that actually share a node (fewer than devices_per_node on a partial single node)."""
        return min(self.num_devices, self.devices_per_node)

    def __str__(self) -> str:
        return f"{self.num_nodes} node(s) x {self.devices_in_node} {self.profile.name} = {self.num_devices}"
