"""Long CLI fuzz run (issue 15): the strategies of tests/cli_fuzz.py, many more invocations than the suite.

    PYTHONPATH=. python benchmarks/fuzz_cli.py --examples 6000 --seed 15

Every invocation runs in-process through autoparallel.cli.main with a 30 s limit and is classified by
tests/cli_fuzz.violation: traceback, hang, bad-error (exit 2 without exactly one `error:` line, or
another exit code), exit-0-on-invalid, invalid-plan; or kept (exit 0 / one-line exit 2). Writes
benchmarks/results/fuzz_cli.json and prints the markdown table of docs/benchmarks_fuzz.md.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import cli_fuzz as F  # noqa: E402
from hypothesis import HealthCheck, given, seed, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

STRATEGIES = {"cluster": F.cluster_case(), "config": F.config_case(), "profile": F.profile_case(),
              "plan_file": F.plan_file_case(), "path": F.path_case()}


def run(examples: int, seed_value: int) -> dict:
    counts: dict[str, collections.Counter] = {name: collections.Counter() for name in STRATEGIES}
    violations: list[dict] = []
    slowest = (0.0, ())
    folder = Path(tempfile.mkdtemp(prefix="fuzz_cli_"))

    @seed(seed_value)
    @settings(max_examples=examples, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.sampled_from(sorted(STRATEGIES)).flatmap(lambda n: st.tuples(st.just(n), STRATEGIES[n])))
    def one(pair: tuple[str, F.Case]) -> None:
        nonlocal slowest
        name, case = pair
        outcome, problem = F.run_case(case, folder)
        counts[name][problem or outcome.kind] += 1
        counts[name]["invalid input" if case.invalid else "valid input"] += 1
        slowest = max(slowest, (outcome.seconds, outcome.argv))
        if problem:
            violations.append({"problem": problem, "argv": list(outcome.argv), "err": outcome.err[-500:],
                               "escaped": outcome.escaped[-2000:],
                               "files": {n: t[:400] for n, t in case.files}})

    t0 = time.perf_counter()
    one()
    total = {k: sum(c[k] for c in counts.values()) for k in
             ("ok", "usage-error", "traceback", "hang", "bad-error", "exit-0-on-invalid", "valid input",
              "invalid input")}
    total["invalid-plan"] = sum(v for c in counts.values() for k, v in c.items() if k.startswith("invalid-plan"))
    return {"examples": examples, "seed": seed_value, "wall_s": round(time.perf_counter() - t0, 1),
            "invocations": total["ok"] + total["usage-error"] + total["traceback"] + total["hang"]
            + total["bad-error"] + total["exit-0-on-invalid"] + total["invalid-plan"],
            "totals": total, "per_strategy": {k: dict(v) for k, v in counts.items()},
            "slowest_s": round(slowest[0], 2), "slowest_argv": list(slowest[1]), "violations": violations}


def markdown(r: dict) -> str:
    t = r["totals"]
    lines = [f"{r['invocations']:,} invocations (seed {r['seed']}) in {r['wall_s']:.0f} s; slowest "
             f"{r['slowest_s']:.2f} s (`{' '.join(r['slowest_argv'])}`).", "",
             "| outcome | count |", "|---|---|"]
    for key in ("ok", "usage-error", "traceback", "hang", "bad-error", "exit-0-on-invalid", "invalid-plan",
                "valid input", "invalid input"):
        lines.append(f"| {key} | {t.get(key, 0):,} |")
    lines += ["", "| strategy | " + " | ".join(("ok", "usage-error", "violations")) + " |", "|---|---|---|---|"]
    for name, c in r["per_strategy"].items():
        bad = sum(v for k, v in c.items() if k not in ("ok", "usage-error", "valid input", "invalid input"))
        lines.append(f"| {name} | {c.get('ok', 0):,} | {c.get('usage-error', 0):,} | {bad} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--examples", type=int, default=6000)
    ap.add_argument("--seed", type=int, default=15)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz_cli.json"))
    args = ap.parse_args()
    import torch
    torch.set_num_threads(1)
    result = run(args.examples, args.seed)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(markdown(result))
    for v in result["violations"][:20]:
        print(v["problem"], v["argv"], v["err"][-200:])


if __name__ == "__main__":
    main()
