"""The one exception type for bad user input, at the bottom of the dependency order
(hardware_profiles <- cost_models <- autoparallel) so that every layer raises the same type; the CLI
prints its message as one line and exits 2. `autoparallel.errors` re-exports it."""

from __future__ import annotations


class UserError(Exception):
    """Bad input from the user: the message says what is wrong, where, and how to fix it."""
