"""Which of the machine's CPUs run the trainer's host work fast (s75): the host's dispatch speed
(trainer_sweep.host_tick) with this process pinned to each CPU in turn, two rounds, beside the topology
(/sys/.../thread_siblings_list), each CPU's clock (/proc/cpuinfo) and busy share (/proc/stat) at the time.

    python benchmarks/host_cpus.py --out host_cpus.jsonl      # on the GPU machine (one GPU)

s74's host ticks around each configuration of one process were bimodal (an eager op 6.3-7.5 or 9-10.5 us, a
Python loop iteration 35-47 or 63-78 ns), switching between configurations: if the slow state belongs to
particular CPUs (a busy hyperthread sibling, another socket), the per-CPU map shows it."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _per_cpu_stat() -> dict[int, list[int]]:
    from trainer_sweep import cpu_stats
    return {int(name[3:]): vals for name, vals in cpu_stats().items() if name[3:].isdigit()}


def _mhz() -> list[float]:
    return [float(line.split(":")[1]) for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("cpu MHz")]


def _siblings(cpu: int) -> str:
    try:
        return Path(f"/sys/devices/system/cpu/cpu{cpu}/topology/thread_siblings_list").read_text().strip()
    except OSError:
        return "?"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    from trainer_sweep import host_tick
    cpus = sorted(os.sched_getaffinity(0))
    with Path(args.out).open("a") as f:
        f.write(json.dumps({"cpus": cpus, "siblings": {c: _siblings(c) for c in cpus}}) + "\n")
        for rnd in range(args.rounds):
            for cpu in cpus:
                os.sched_setaffinity(0, {cpu})
                s0, t0 = _per_cpu_stat(), time.time()
                tick = host_tick()
                s1 = _per_cpu_stat()
                busy = {c: 1 - (s1[c][3] - s0[c][3] + s1[c][4] - s0[c][4]) / max(1, sum(s1[c]) - sum(s0[c]))
                        for c in s1}
                rec = {"round": rnd, "cpu": cpu, "time": t0, "tick": tick, "mhz": _mhz(),
                       "busy": {c: round(b, 3) for c, b in busy.items()}}
                f.write(json.dumps(rec) + "\n")
                print(json.dumps({k: rec[k] for k in ("round", "cpu", "tick")}), flush=True)
    os.sched_setaffinity(0, set(cpus))
    return 0


if __name__ == "__main__":
    sys.exit(main())
