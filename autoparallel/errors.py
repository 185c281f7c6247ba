"""One exception type for bad user input: the CLI prints its message as one line and exits 2.
(Defined in hardware_profiles.errors, the bottom layer, so cost models and profiles raise it too.)"""

from __future__ import annotations

import sys
from collections.abc import Callable

from hardware_profiles.errors import UserError, did_you_mean

__all__ = ["UserError", "did_you_mean", "exit_on_user_error"]


def exit_on_user_error(main: Callable[[], object]) -> None:
    """Run a script's `main()` as the CLI runs a command: a UserError becomes one `error: ...` line on
    stderr and exit code 2 instead of a traceback (for examples and user scripts)."""
    try:
        main()
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
