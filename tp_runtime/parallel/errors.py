"""LaunchError: the error every launcher raises when a rank fails or cannot start."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A rank failed or could not start; the message names the rank and the cause."""
