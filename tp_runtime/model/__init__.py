"""The math of one rank's shard of DSV4 attention: layers, rotary, compressor, indexer, caches, the stack.

No launching, no timing: the engine runs it, the bench times it.
"""
