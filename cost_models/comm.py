"""Collective communication times, alpha-beta model (ring algorithms, as NCCL/RCCL/HCCL use).

For a group of n ranks, message size S bytes (the full, unsharded tensor), per-rank link bandwidth
B (bytes/s per direction) reached at efficiency e, and per-hop latency a (s):

    all-reduce        t = 2(n-1)/n * S / (B e) + 2(n-1) a
    all-gather        t =  (n-1)/n * S / (B e) +  (n-1) a      (S = gathered output size)
    reduce-scatter    t =  (n-1)/n * S / (B e) +  (n-1) a      (S = input size before scatter)
    all-to-all        t =  (n-1)/n * S / (B e) +  (n-1) a      (S = bytes each rank sends in all)
    send/recv         t =  S / (B e) + a

A group whose ranks share a node uses the node's link (NVLink, xGMI, HCCS, ...); a group that
crosses nodes is limited by each device's NIC (hierarchical collectives are bound by the slowest hop).
"""

from __future__ import annotations

from dataclasses import dataclass

from hardware_profiles import HardwareProfile


@dataclass(frozen=True)
class Link:
    bandwidth: float   # bytes/s per direction per rank
    latency: float     # s per hop
    efficiency: float  # achieved fraction of bandwidth

    @property
    def effective_bandwidth(self) -> float:
        return self.bandwidth * self.efficiency


def link_for(profile: HardwareProfile, span: str) -> Link:
    """The link a mesh dimension's collectives run on: 'intra' (inside a node) or 'inter'."""
    eff = profile.efficiency
    if span == "intra":
        return Link(profile.intra_bandwidth, profile.intra_latency, eff.collective_intra)
    return Link(profile.inter_bandwidth, profile.inter_latency, eff.collective_inter)


def all_reduce_time(size_bytes: float, n: int, link: Link) -> float:
    """2(n-1)/n * S/(B e) + 2(n-1) a   [s]"""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return 2 * (n - 1) / n * size_bytes / link.effective_bandwidth + 2 * (n - 1) * link.latency


def all_gather_time(size_bytes: float, n: int, link: Link) -> float:
    """(n-1)/n * S/(B e) + (n-1) a   [s], S = the gathered (full) size"""
    if n <= 1 or size_bytes <= 0:
        return 0.0
    return (n - 1) / n * size_bytes / link.effective_bandwidth + (n - 1) * link.latency


reduce_scatter_time = all_gather_time  # same volume per rank: (n-1)/n * S
all_to_all_time = all_gather_time      # each rank keeps 1/n of what it sends


def send_recv_time(size_bytes: float, link: Link) -> float:
    """S/(B e) + a   [s]"""
    if size_bytes <= 0:
        return 0.0
    return size_bytes / link.effective_bandwidth + link.latency
