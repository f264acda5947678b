"""Training benchmarks: the step itself measured (scaling, the levers, the strategies side by side, the data path,
the exporter's cost, a peer framework), each as a ratio to a named alternative measured in the same run."""
