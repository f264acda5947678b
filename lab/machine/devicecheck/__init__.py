"""The one-command device check (`make gpu-check`, `lab gpu-check`): a harness above everything it runs. It
plans its steps, runs each as a `lab` command (training, benchmarks, pitfalls, memory) within a deadline, and
writes a table and gpu-check.json, partial when the deadline cuts it short."""
