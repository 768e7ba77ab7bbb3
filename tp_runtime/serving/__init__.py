"""`tp-runtime serve-bench`: requests arriving at a rate or from N clients, served by continuous batching on the
ranks, latency and throughput per (graph mode, load) from device-side token timestamps."""
