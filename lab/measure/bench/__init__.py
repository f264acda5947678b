"""Benchmarks, one concept a folder: comm/ (the collectives, NCCL's settings, host<->device copies) and train/ (the
training step: scaling, levers, strategies, data path, exporter cost, a peer). registry.py holds one row per
benchmark (its name, arguments and run); how a result is shown in a lesson or a report is lab.course.teaching's."""
