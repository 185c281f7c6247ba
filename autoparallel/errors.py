"""One exception type for bad user input: the CLI prints its message as one line and exits 2."""


class UserError(Exception):
    """Bad input from the user: the message says what is wrong, where, and how to fix it."""
