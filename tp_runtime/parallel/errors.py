"""LaunchError: the error every launcher raises when a rank fails or cannot start; RankLostError: what
a rank raises when its collective failed because a peer stopped answering (heartbeat.py)."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A rank failed or could not start; the message names the rank and the cause."""


class RankLostError(RuntimeError):
    """A collective failed and the heartbeat names the peer that stopped answering."""
