"""torchrun itself: torch.distributed.run's `main`, unchanged, started as the lab's own program.

`python -m lab.run.cluster.torchrun ARGS` is `torchrun ARGS` (`python -m torch.distributed.run ARGS`). The one
difference is that `lab` is imported before torch, so torch's import-time objects are frozen out of the garbage
collector in the agent as in its ranks (lab/frozen_imports.py): the agent's exit no longer walks them, about a
CPU-second saved at each launch (BENCHMARKS.md, "frozen imports").
"""

from torch.distributed.run import main

if __name__ == "__main__":
    main()
