"""A workshop room: one JupyterHub, a seat per learner with its own GPUs, cores, memory, system user and runs,
and an instructor who sees every seat's lessons.

    lab room plan --gpus 8 --seats 4     # the table an instructor checks before the learners arrive (plan.py)
    lab room serve --seats 3             # the hub and its seats (`make room`: serve.py, hub.py, seats.py)
    lab room status                      # seats by lessons: passed, failed, not run; each seat's run (status.py)

The plan is the one source of a seat's resources: the hub's spawners (a local process per system user, a
DockerSpawner container, a batchspawner Slurm job) all read them from it. Nothing here imports torch.
"""
