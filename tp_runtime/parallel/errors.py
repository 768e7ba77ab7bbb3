"""LaunchError: the error every launcher raises when a rank fails or cannot start; LaunchRefused: the run
was refused before any rank was placed (the cluster cannot hold it); RankLostError: what a rank raises when
its collective failed because a peer stopped answering (heartbeat.py)."""

from __future__ import annotations


class LaunchError(RuntimeError):
    """A rank failed or could not start; the message names the rank and the cause."""


class LaunchRefused(LaunchError):
    """Nothing was placed: what the run asks for (devices, bundles) is not in the cluster; the command exits 2."""


class RankLostError(RuntimeError):
    """A collective failed and the heartbeat names the peer that stopped answering."""
