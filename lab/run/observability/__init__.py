"""What a run shows while it runs: the Prometheus exporter and its series, the profiler, device memory."""
