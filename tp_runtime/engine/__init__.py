"""Running a shard: step plans and buffers, the model shard, per-size graphs, the worker, the driver,
the scheduler, workloads and the run report; `entry.py` is the per-rank entry every launcher runs.
"""
