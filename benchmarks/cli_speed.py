"""End-to-end speed of the command line as a user sees it (issue 17's acceptance numbers).

    python benchmarks/cli_speed.py [--runs 5]

Every command runs in a fresh interpreter (`python -m autoparallel.cli ...`), timed from spawn to exit,
with the time to its first line on stderr or stdout. "cold" runs use an empty trace cache (a new
temporary AUTOPARALLEL_CACHE_DIR per run), "warm" ones a cache filled by a previous run. The solver
wall time and status come from `plan --json`. The SC'21 1008B / 3072-GPU row is planned in-process
(as benchmarks/plan_speed.py: no overlap of gradient sync, as Megatron ran it), each run with a fresh
cost model. Medians over --runs; the machine is shared, so the min and max are given too.
Writes benchmarks/results/cli_speed.json, docs/benchmarks_cli.md and the section between the
`cli_speed` markers in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PLAN_70B = ["plan", "llama3-70b", "--hardware", "h100-sxm", "--gpus", "64", "--global-batch", "512",
            "--seq-len", "4096", "--max-memory-per-gpu", "80GB"]


@dataclass
class Run:
    total_s: float
    cpu_s: float            # user + system CPU seconds of the child
    first_line_s: float | None
    returncode: int
    stdout: str


@dataclass
class Row:
    name: str
    command: str
    target: str
    totals: list[float] = field(default_factory=list)
    cpus: list[float] = field(default_factory=list)
    first_lines: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def summary(self) -> dict:
        def stats(xs: list[float]) -> dict | None:
            return _stats(xs) if xs else None
        return {"name": self.name, "command": self.command, "target": self.target, "total_s": stats(self.totals),
                "cpu_s": stats(self.cpus), "first_line_s": stats(self.first_lines), **self.extra}


def run_cli(args: list[str], cache_dir: str) -> Run:
    """Spawn the CLI; note when its first output line arrives and when it exits."""
    env = {**os.environ, "AUTOPARALLEL_CACHE_DIR": cache_dir,
           "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "autoparallel.cli", *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    first: list[float] = []
    out: list[str] = []

    def watch(stream, keep: bool) -> None:
        for line in stream:
            if not first:
                first.append(time.perf_counter() - t0)
            if keep:
                out.append(line)

    threads = [threading.Thread(target=watch, args=(proc.stdout, True)),
               threading.Thread(target=watch, args=(proc.stderr, False))]
    for t in threads:
        t.start()
    _, status, usage = os.wait4(proc.pid, 0)
    total = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    for t in threads:
        t.join()
    return Run(total, usage.ru_utime + usage.ru_stime, min(first) if first else None, proc.returncode, "".join(out))


def measure(name: str, args: list[str], target: str, runs: int, cold: bool, expect_rc: int = 0) -> Row:
    row = Row(name, "autoparallel " + " ".join(args), target)
    with tempfile.TemporaryDirectory() as warm_dir:
        if not cold:
            run_cli(args, warm_dir)  # fill the cache
        for _ in range(runs):
            with tempfile.TemporaryDirectory() as cold_dir:
                r = run_cli(args, cold_dir if cold else warm_dir)
            if r.returncode != expect_rc:
                raise RuntimeError(f"{row.command}: exit {r.returncode}")
            row.totals.append(r.total_s)
            row.cpus.append(r.cpu_s)
            if r.first_line_s is not None:
                row.first_lines.append(r.first_line_s)
            if "--json" in args and r.returncode == 0:
                solver = json.loads(r.stdout)["solver"]
                row.extra.setdefault("solver_wall_s", []).append(solver["wall_s"])
                row.extra.setdefault("solver_cpu_s", []).append(solver["cpu_s"])
                row.extra["status"] = solver["status"]
                p = json.loads(r.stdout)["plan"]
                row.extra["plan"] = (f"dp{p['dp']} tp{p['tp']} pp{p['pp']} vpp{p['vpp']} mb{p['micro_batch']} "
                                     f"zero{p['zero']}{' sp' if p['sequence_parallel'] else ''}")
    if "solver_wall_s" in row.extra:
        row.extra["solver_s"] = _stats(row.extra.pop("solver_wall_s"))
        row.extra["solver_cpu_s"] = _stats(row.extra.pop("solver_cpu_s"))
    return row


def _stats(xs: list[float]) -> dict:
    return {"median": round(statistics.median(xs), 3), "min": round(min(xs), 3), "max": round(max(xs), 3)}


def sc21_row(runs: int) -> Row:
    """The 1008B / 3072-GPU row of Megatron SC'21 Table 1, planned in-process."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from plan_speed import CASES

    from autoparallel.api import context, plan_result
    from autoparallel.specs import load_model_spec
    case = CASES[0]
    model = load_model_spec(case["model"])
    row = Row(case["name"], "python benchmarks/cli_speed.py (in-process, see plan_speed.py)", "solver <= 2 s")
    graph = context(model, case["hardware"], case["gpus"], case["seq_len"], overlap_grad_sync=False).graph
    walls, cpus = [], []
    for _ in range(runs):
        res, _ = plan_result(model, hardware=case["hardware"], gpus=case["gpus"], global_batch=case["global_batch"],
                             seq_len=case["seq_len"], graph=graph, overlap_grad_sync=False, top_k=0)
        walls.append(res.solver.wall_s)
        cpus.append(res.solver.cpu_s)
        p = res.plan
        row.extra["status"] = res.solver.status
        row.extra["plan"] = (f"dp{p.dp} tp{p.tp} pp{p.pp} vpp{p.vpp} mb{p.micro_batch} zero{p.zero}"
                             f"{' sp' if p.sequence_parallel else ''}")
    row.extra["solver_s"] = _stats(walls)
    row.extra["solver_cpu_s"] = _stats(cpus)
    return row


def table(rows: list[dict], runs: int, load: float) -> str:
    def fmt(s: dict | None) -> str:
        return "-" if s is None else f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"
    lines = ["## CLI speed", "",
             f"Command: `python benchmarks/cli_speed.py --runs {runs}` ({platform.machine()}, {os.cpu_count()} cores "
             f"shared with other work, Python {platform.python_version()}). Each command in a fresh interpreter; "
             "median (min-max) seconds over the runs; cold = empty trace cache, warm = cache filled by an "
             "earlier run; first line = first line on stderr or stdout. Wall seconds depend on what else "
             "runs on the shared cores (load average at the start: "
             f"{load:.1f}); CPU seconds (user + system of the process, or of the search for "
             "the solver) are what a quiet machine's wall time approaches.", "",
             "| case | command | target | total s (wall) | total s (CPU) | first line s | solver s (wall) | "
             "solver s (CPU) | status | plan |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['name']} | `{r['command']}` | {r['target']} | {fmt(r['total_s'])} | {fmt(r['cpu_s'])} | "
                     f"{fmt(r['first_line_s'])} | {fmt(r.get('solver_s'))} | {fmt(r.get('solver_cpu_s'))} | "
                     f"{r.get('status', '-')} | {r.get('plan', '-')} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=5)
    args = ap.parse_args()
    n = args.runs
    load = os.getloadavg()[0]
    rows = [
        measure("--help", ["--help"], "<= 0.3 s", n, cold=True),
        measure("profiles list", ["profiles", "list"], "<= 0.3 s", n, cold=True),
        measure("argument error", ["plan", "llama3-70b"], "<= 0.3 s, exit 2", n, cold=True, expect_rc=2),
        measure("plan llama3-70b, warm cache", [*PLAN_70B, "--json"], "<= 3 s; solver <= 0.5 s", n, cold=False),
        measure("plan llama3-70b, cold cache", [*PLAN_70B, "--json"], "<= 6 s", n, cold=True),
        measure("plan llama3-70b, progress", PLAN_70B, "first line <= 1 s", n, cold=True),
        measure("trace llama3-70b, cold cache", ["trace", "llama3-70b", "--seq-len", "4096"], "first line <= 1 s",
                n, cold=True),
        measure("compare llama3-70b, cold cache", ["compare", "llama3-70b", "--hardware", "h100-sxm,mi300x",
                                                  "--gpus", "64", "--global-batch", "512", "--seq-len", "4096"],
                "first line <= 1 s", n, cold=True),
    ]
    out = [r.summary() for r in rows] + [sc21_row(n).summary()]
    for r in out:
        print(json.dumps(r), flush=True)
    (ROOT / "benchmarks" / "results" / "cli_speed.json").write_text(json.dumps(out, indent=1) + "\n")
    text = table(out, n, load)
    (ROOT / "docs" / "benchmarks_cli.md").write_text(text)
    bench = ROOT / "docs" / "benchmarks.md"
    doc = bench.read_text()
    marked = re.compile(r"<!-- cli_speed -->\n.*?<!-- /cli_speed -->", re.S)
    section = f"<!-- cli_speed -->\n{text}<!-- /cli_speed -->"
    bench.write_text(marked.sub(lambda _: section, doc) if marked.search(doc)
                     else doc.replace("\n## Tracer scale benchmark", f"\n{section}\n\n## Tracer scale benchmark", 1))


if __name__ == "__main__":
    main()
