"""`hardware="auto"`: detect the local accelerator and match a shipped hardware profile."""

from __future__ import annotations

import torch

from autoparallel.errors import UserError


def resolve_hardware(hardware: str | None, device: torch.device) -> str | None:
    """A profile name or path for the planner, or None when running on a CPU with hardware="auto"
    (there is no CPU profile; the trainer then executes a plain data-parallel plan)."""
    if hardware is None or str(hardware).lower() == "auto":
        if device.type != "cuda":
            return None
        from hardware_profiles import list_profiles, match_device

        name = torch.cuda.get_device_name(device)
        found = match_device(name, torch.cuda.get_device_properties(device).total_memory)
        if found is None:
            raise UserError(f"hardware=auto: no hardware profile matches the local device {name!r}; pass "
                            f"hardware=<name or YAML path>, one of: {', '.join(list_profiles())}")
        return found
    from hardware_profiles import load_profile

    load_profile(hardware)  # validates the name or path now, with its own UserError
    return str(hardware)


def local_budget(device: torch.device, profile: str) -> int | None:
    """The default planner budget: what the local accelerator reports as its capacity times the profile's
    usable fraction (the reserve the profile keeps for the driver, NCCL and the allocator), so that a card
    smaller than the profile's (a cut-down or partitioned one) is planned for what it has; None off the GPU
    (the planner then takes the profile's own usable memory)."""
    if device.type != "cuda":
        return None
    from hardware_profiles import load_profile

    total = torch.cuda.get_device_properties(device).total_memory
    return int(total * load_profile(profile).usable_fraction)


def attention_kernel(device: torch.device) -> str:
    """The causal SDPA kernel torch runs on `device`, as the cost model names them (compute.ATTENTION_KERNELS):
    "flash" where torch picks its flash backend (FlashAttention-2, which the shipped Hopper profiles price with
    their own terms: torch < 2.9, or a bundled cuDNN < 9.15, runs it there at 1.8-1.9x cuDNN's time), else
    "default" (the kernel the shipped calibrations timed: cuDNN's on Hopper with torch 2.11). Parts without
    flash terms in their profile price "flash" as their default kernel, which there is flash."""
    from torch.nn.attention import SDPBackend

    if device.type != "cuda":
        return "default"
    return "flash" if _sdpa_choice(device) == int(SDPBackend.FLASH_ATTENTION) else "default"


def _sdpa_choice(device: torch.device) -> int | None:
    """The SDPBackend torch's dispatcher picks for a causal bf16 call without a mask on `device` (None when
    this torch cannot say)."""
    q = torch.empty(1, 8, 256, 128, dtype=torch.bfloat16, device=device)
    try:
        return int(torch._fused_sdp_choice(q, q, q, is_causal=True))
    except (AttributeError, RuntimeError):
        return None
