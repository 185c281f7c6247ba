"""Run the CLI in-process and classify the outcome (shared by the hardening tests, the fuzz suite and
benchmarks/fuzz_cli.py).

The promise under test (README): every invocation ends with exit 0, or with exit 2 and exactly one
`error: ...` line on stderr; never a traceback, never a hang. In-process (autoparallel.cli.main) rather
than a subprocess per invocation: thousands of runs fit in CI time, and the trace cache is shared.
"""

from __future__ import annotations

import contextlib
import io
import signal
import time
import traceback
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from autoparallel.cli import main

HANG_S = 30.0  # the bound: an invocation past this is a hang


class Hang(Exception):
    """Raised by the interval timer inside a run that took longer than its limit."""


@dataclass(frozen=True)
class Outcome:
    argv: tuple[str, ...]
    rc: int | None          # None: an exception escaped main (a traceback for a user)
    out: str
    err: str
    seconds: float
    escaped: str = ""       # the escaped exception's traceback, or "hang"

    @property
    def error_lines(self) -> list[str]:
        return [line for line in self.err.splitlines() if line.startswith("error:")]

    @property
    def kind(self) -> str:
        """ok | usage-error | traceback | hang | bad-error (exit 2 without exactly one error line, or
        another exit code)."""
        if self.escaped == "hang":
            return "hang"
        if self.rc is None or "Traceback (most recent call last)" in self.err:
            return "traceback"
        if self.rc == 0:
            return "ok"
        if self.rc == 2 and len(self.error_lines) == 1:
            return "usage-error"
        return "bad-error"


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    def on_alarm(_sig: int, _frame: object) -> None:
        raise Hang()
    old = signal.signal(signal.SIGALRM, on_alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def run_cli(argv: Sequence[str], limit_s: float = HANG_S) -> Outcome:
    """One CLI invocation in this process: exit code, stdout, stderr, and what escaped (if anything)."""
    out, err = io.StringIO(), io.StringIO()
    rc: int | None = None
    escaped = ""
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            with _time_limit(limit_s):
                rc = main(list(argv))
        except Hang:
            escaped = "hang"
        except SystemExit as e:  # main() returns its code; a SystemExit is someone else's exit
            rc = e.code if isinstance(e.code, int) else 1
            escaped = f"SystemExit({e.code!r})"
        except BaseException:  # noqa: BLE001 - anything escaping main is what the fuzzing looks for
            escaped = traceback.format_exc()
    return Outcome(tuple(argv), rc if not escaped or escaped.startswith("SystemExit") else None,
                   out.getvalue(), err.getvalue(), time.perf_counter() - t0, escaped)
