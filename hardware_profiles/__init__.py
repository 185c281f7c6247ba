"""Hardware profiles: one YAML file per accelerator (peaks, memory, links, efficiencies, sources).

    from hardware_profiles import load_profile, Cluster
    cluster = Cluster(load_profile("a100-sxm-80gb"), num_devices=64)

All values on the dataclasses are SI: FLOP/s, bytes, bytes/s, seconds.
"""

from hardware_profiles.loader import (
    PROFILE_DIR,
    format_profile,
    list_profiles,
    load_profile,
    match_device,
    profile_from_yaml,
    profile_to_dict,
    profile_to_yaml,
    validate_profile_file,
)
from hardware_profiles.profile import Cluster, Efficiency, HardwareProfile
from hardware_profiles.units import parse_bandwidth, parse_bytes, parse_flops, parse_time

__all__ = [
    "PROFILE_DIR",
    "Cluster",
    "Efficiency",
    "HardwareProfile",
    "format_profile",
    "list_profiles",
    "load_profile",
    "match_device",
    "parse_bandwidth",
    "parse_bytes",
    "parse_flops",
    "parse_time",
    "profile_from_yaml",
    "profile_to_dict",
    "profile_to_yaml",
    "validate_profile_file",
]
