"""The run around the ranks: the scheduler (continuous batching), the step loop every rank runs (rank 0
schedules and broadcasts), workloads, the run report, and `entry.py`, the per-rank entry every launcher runs.
"""
