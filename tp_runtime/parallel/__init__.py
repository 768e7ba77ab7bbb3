"""The TP group and its collectives (group.py), and the launchers that start ranks (local, Ray, torchrun)."""
