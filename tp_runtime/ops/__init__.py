"""Kernels of stage B behind one interface: torch_path.py is the semantics and the CPU path."""
