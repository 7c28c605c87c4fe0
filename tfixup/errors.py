"""Errors that end a command in one line: the message names the bad input and the fix, and a
traceback above it would only bury it. ``one_line_errors()`` (installed when the plugin is imported)
makes an uncaught ``Refused`` print as ``error: MESSAGE`` alone; every other error keeps its traceback."""

import sys


class Refused(ValueError):
    """An input this project refuses, in one line naming it and the fix."""


def one_line_errors() -> None:
    """An uncaught ``Refused`` ends a command line tool (fairseq-train, -generate, ...) with its line alone. Idempotent."""
    if getattr(sys.excepthook, "tfixup", False):
        return
    previous = sys.excepthook

    def hook(kind, error, tb):
        if isinstance(error, Refused):
            print(f"error: {error}", file=sys.stderr)
        else:
            previous(kind, error, tb)

    hook.tfixup = True
    sys.excepthook = hook
