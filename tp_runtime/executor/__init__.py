"""One rank's execution: step plans in, the model shard (weights, caches, static buffers), its graphs per
capture size, the Worker that steps them, and the step timer. Nothing here decides what runs next."""
