"""The one exception type for bad user input, at the bottom of the dependency order
(hardware_profiles <- cost_models <- autoparallel) so that every layer raises the same type; the CLI
prints its message as one line and exits 2. `autoparallel.errors` re-exports it."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class UserError(Exception):
    """Bad input from the user: the message says what is wrong, where, and how to fix it."""


def did_you_mean(word: object, choices: Iterable[str]) -> str:
    """' (did you mean 'x'?)' for the choice closest to a mistyped key, or '' where none is close."""
    close = difflib.get_close_matches(str(word), sorted(choices), n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


MAX_NAME_CHARS = 255           # one path component (NAME_MAX on Linux / macOS)


def check_reference(ref: str, what: str) -> None:
    """A name or path the OS can look up: no path component over NAME_MAX, no NUL byte (else OSError)."""
    if "\x00" in ref:
        raise UserError(f"{what} {ref[:40]!r}...: contains a NUL byte; pass a name or a file path")
    long = next((part for part in ref.replace("\\", "/").split("/") if len(part.encode()) > MAX_NAME_CHARS), None)
    if long is not None:
        raise UserError(f"{what} {ref[:40]!r}... ({len(ref)} characters): a name or path component longer than "
                        f"{MAX_NAME_CHARS} bytes cannot exist; pass a shorter name or path")
