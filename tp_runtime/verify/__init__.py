"""Verification: `tp-runtime check` (check.py) and the float64 oracle it compares against (reference.py)."""
