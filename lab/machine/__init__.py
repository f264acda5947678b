"""The machine wing: is this host, this fabric, this GPU fit (health, the device check, a cluster's acceptance).

Its commands (lab.machine.commands): doctor, validate, accept, gpu-check. It sits on top: the device check runs
the other wings' commands (training, benchmarks, pitfalls, an exercise's reference) and tabulates them.
"""
