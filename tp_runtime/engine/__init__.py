"""The run around the ranks: the scheduler (continuous batching), the step loop every rank runs (rank 0
schedules and broadcasts; it never waits on the GPU per decode step), workloads and how their inputs reach the
device, the run report, and `entry.py`, the per-rank entry every launcher runs.
"""
