"""InputError: a user's input file (workload.inputs) that cannot be used. Apart from workload.py, which reads the
file, so that the command line names the refusal without importing torch (seconds) for a config it refuses first."""

from __future__ import annotations


class InputError(ValueError):
    """A user input file that cannot be used; the message names the tensor and the file."""
