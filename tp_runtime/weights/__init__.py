"""Weights: the shard table (specs.py), seeded fill, checkpoint format, reading and writing, FP8 blocks."""
