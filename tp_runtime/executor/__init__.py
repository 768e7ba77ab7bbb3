"""One rank's execution: step plans in, the model shard (weights, caches, static buffers), its graphs per
capture size, the Worker that steps them, the step timer, and the pinned staging ring that copies host data to
the device without waiting on it. Nothing here decides what runs next."""
