"""A test rank: runs the lab's Trainer in this process and saves what the tests compare.

    python tests/distributed/worker.py MODE OUT_DIR [section.key=value ...]                 # world size 1
    torchrun --standalone --nproc-per-node 2 tests/distributed/worker.py MODE OUT_DIR [section.key=value ...]

MODE is one of:
  fit      trains the smoke config (with the overrides on top) and saves each rank's log rows
           as rows<rank>.json and its final parameters, momentum and step as final<rank>.pt;
  grads    runs the smoke config's first micro-batch and saves each rank's gradients after
           DDP's all-reduce as grads<rank>.pt;
  shipped  trains every shipped config in turn (with the overrides on top) and saves each one's
           log rows as rows-<config>-<rank>.json: one torchrun start for all of them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from lab.run import config, data
from lab.run.cluster import dist
from lab.run.training.trainer import Trainer, set_determinism


def shipped(out: Path, overrides: list[str]) -> None:
    names = config.shipped_names()
    with dist.initialized(config.load(names[0], overrides).dist) as ctx:
        for name in names:
            cfg = config.load(name, overrides)
            set_determinism(cfg.run.deterministic)
            rows: list[dict] = []
            Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device), hooks=[rows.append]).fit()
            (out / f"rows-{name}-{ctx.global_rank}.json").write_text(json.dumps(rows))


MODES = ("fit", "grads", "shipped")


def main() -> None:
    if len(sys.argv) < 3 or sys.argv[1] not in MODES:
        sys.exit(f"usage: worker.py {{{','.join(MODES)}}} OUT_DIR [section.key=value ...]")
    mode, out, overrides = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if mode == "shipped":
        return shipped(out, overrides)
    cfg = config.load("smoke", overrides)
    with dist.initialized(cfg.dist) as ctx:
        set_determinism(cfg.run.deterministic)
        rows: list[dict] = []
        trainer = Trainer(cfg, ctx, data.load(cfg.data).to(ctx.device), hooks=[rows.append])
        rank = ctx.global_rank
        if mode == "grads":
            inputs, labels = next(trainer.train_loader.epoch(0))
            trainer.forward_backward(inputs, labels)
            torch.save({n: p.grad for n, p in trainer.model.named_parameters()}, out / f"grads{rank}.pt")
        else:
            trainer.fit()
            momentum = {n: trainer.optimizer.state[p]["momentum_buffer"] for n, p in trainer.model.named_parameters()}
            torch.save(
                {
                    "params": trainer.model.state_dict(),
                    "momentum": momentum,
                    "step": trainer.step,
                    "backend": ctx.backend,
                    "wrapped_in_ddp": getattr(trainer.strategy, "ddp", None) is not None,
                },
                out / f"final{rank}.pt",
            )
            (out / f"rows{rank}.json").write_text(json.dumps(rows))


if __name__ == "__main__":
    main()
