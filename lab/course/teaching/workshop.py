"""The default lab: `make lab` and `docker compose up lab` run this. Its parts, in order
(`--only PART,...` runs some of them; the report always closes):

training   1. the baseline, one process (one GPU), the whole global batch, stopped halfway;
           2. its checkpoint opened: what a resumable checkpoint holds, and that a plain model loads it;
           3. the baseline resumed from that checkpoint to the end;
           4. DDP with the same global batch split over N processes: N = 2 and 4 on a CPU (threads divided
              so they fit its cores); 2, 4, 8 GPUs (as many as the host has), each run on the first N;
           5. a comparison of the runs, printed and saved: loss at matching steps, final accuracy, images/s;
pitfalls   the lecture's four pitfalls shown broken, then fixed (`lab pitfall`), and on a GPU host what
           CUDA_VISIBLE_DEVICES changes;
allreduce  the all-reduce benchmark (nccl-tests' algbw and busbw);
scaling    strong scaling over 1, 2, 4, ... processes (4 on a CPU, the GPUs present on a GPU server) with
           Amdahl's law fitted and projected, and where a step's time goes; weak scaling with Gustafson's;
levers     bf16, gradient accumulation, DDP bucket sizes and NCCL variables against the plain DDP step;
memory     a 7B model under DDP vs ZeRO/FSDP, and ResNet-18 measured;
strategies the same training under DDP, FSDP, DeepSpeed ZeRO-1/2/3 and Horovod side by side;
report     report.md with plots.

The benchmarks run over 2 ranks on a CPU and over every GPU on a GPU server. Everything lands in one
folder: runs/<workshop id>/{baseline, ddp-N, checkpoint.json, comparison.md, pitfall-*.json,
allreduce.json, scaling-strong.json, scaling-weak.json, levers.json, memory.json, strategies.json,
report.md, *.png}.
"""

from __future__ import annotations

import shlex
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from lab.course.teaching import comparison
from lab.course.teaching import parts as benchmark_parts
from lab.errors import LabError
from lab.run import config
from lab.run.cluster import cores, launch, runner
from lab.run.config import Config
from lab.run.training import runs

OWN_PARTS = ("training", "pitfalls")  # then the benchmarks' parts (lab.course.teaching.parts)
LECTURE_PITFALLS = ("set-epoch", "checkpoint-every-rank", "batchnorm", "uneven-batches")


@dataclass(frozen=True)
class Step:
    part: str
    title: str
    processes: int  # on this host, for the threads each gets
    command: list[str] | Callable[[], None]  # a command line, or work done in this process


def ddp_sizes(requested: int | None, gpus: int) -> list[int]:
    """World sizes for the DDP runs: the one asked for, else 2 and 4 on a CPU (the course's 2 then 4 GPUs,
    at one global batch), else 2, 4, 8, ... up to the GPUs present.

    >>> ddp_sizes(None, 0), ddp_sizes(None, 8), ddp_sizes(None, 6), ddp_sizes(3, 8), ddp_sizes(None, 2)
    ([2, 4], [2, 4, 8], [2, 4, 6], [3], [2])
    """
    if requested is not None:
        return [requested]
    if gpus == 0:
        return [2, 4]
    if gpus < 2:
        return [2]
    sizes = [n for n in (2, 4, 8, 16, 32) if n <= gpus]
    return sizes if sizes[-1] == gpus else [*sizes, gpus]


def parts(only: str | None) -> list[str]:
    """The parts `--only` names, in the workshop's order (every part when `only` is None).

    >>> parts(None)
    ['training', 'pitfalls', 'allreduce', 'scaling', 'levers', 'memory', 'strategies']
    >>> parts("scaling,pitfalls")
    ['pitfalls', 'scaling']
    """
    every = [*OWN_PARTS, *benchmark_parts.PARTS]
    if not only:
        return every
    asked = [p.strip() for p in only.split(",") if p.strip()]
    unknown = [p for p in asked if p not in every]
    if unknown or not asked:
        raise LabError(
            f"--only {only}: unknown part {', '.join(unknown) or '(none given)'}; "
            f"choose from {', '.join(every)} (comma-separated)"
        )
    return [p for p in every if p in asked]


def default_config() -> str:
    """workshop-gpu where CUDA devices are visible, else workshop-cpu: a plain `lab workshop` (the
    image's default command) fits the machine it runs on."""
    import torch

    return "workshop-gpu" if torch.cuda.is_available() else "workshop-cpu"


def run(
    config_name: str, overrides: list[str], nproc_per_node: int | None, output_dir: str, only: str | None = None
) -> int:
    if nproc_per_node is not None and nproc_per_node < 2:
        raise LabError(f"--nproc-per-node: {nproc_per_node}; the workshop compares 1 process with 2 or more")
    chosen = parts(only)
    gpus = cores.gpu_count()
    sizes = ddp_sizes(nproc_per_node, gpus)
    if gpus and sizes[-1] > gpus:
        raise LabError(f"--nproc-per-node: {sizes[-1]} processes but this host has {gpus} GPU(s)")
    cfg = config.load(config_name, overrides)  # refuse bad input before anything runs
    for n in sizes:
        config.check_layout(cfg, n)
    workshop_id = runs.new_run_id("workshop")
    folder = Path(output_dir) / workshop_id
    folder.mkdir(parents=True)
    print(f"workshop {workshop_id}: config {cfg.origin}; results in {folder}", flush=True)
    steps = [s for s in plan(cfg, config_name, overrides, sizes, gpus, folder) if s.part in chosen]
    runner.check_processes(max((s.processes for s in steps), default=1), "lab workshop")  # before the first step
    total = len(steps) + 1  # + the report
    started = time.monotonic()
    for index, step in enumerate(steps, start=1):
        step_started = time.monotonic()
        if callable(step.command):  # work of this process
            print(f"\n== {index}/{total} {step.title}", flush=True)
            step.command()
        else:
            print(f"\n== {index}/{total} {step.title}\n$ {shlex.join(step.command)}", flush=True)
            if (
                runner.run(
                    step.command, env=_env(step.processes, gpus > 0), processes=step.processes, echo=False
                ).returncode
                != 0
            ):
                print(f"workshop: step '{step.title}' failed; see the output above", file=sys.stderr)
                return 1
        print(f"(step {index}: {time.monotonic() - step_started:.0f} s)", flush=True)
    print(f"\n== {total}/{total} report", flush=True)
    from lab.course.teaching import report

    path = report.build([str(folder)])
    print(f"report: {path}", flush=True)
    print(
        f"workshop {workshop_id}: {len(steps) + 1} steps in {(time.monotonic() - started) / 60:.1f} minutes", flush=True
    )
    return 0


def plan(cfg: Config, config_name: str, overrides: list[str], sizes: list[int], gpus: int, folder: Path) -> list[Step]:
    """Every step of the workshop on this host, in order."""
    lab = [sys.executable, "-m", "lab"]
    set_args = [x for o in overrides for x in ("--set", o)]
    # Benchmarks over the one DDP size asked for, else the lab's default: every GPU, or 2 CPU processes (more
    # ranks than cores measure turns).
    ranks = sizes[0] if len(sizes) == 1 else cores.default_ranks(gpus, fewest_gpus=2)

    def train_target(name: str, *extra: str) -> list[str]:
        return launch.lab_target(
            "train", config_name, [*overrides, f"run.output_dir={folder}", f"run.id={name}", *extra]
        )

    halfway = max(1, _total_steps(cfg) // 2)
    steps = [
        Step(
            "training",
            f"baseline: 1 process, stopped at step {halfway} of {_total_steps(cfg)}",
            1,
            [sys.executable, *train_target("baseline", f"train.stop_after_steps={halfway}")],
        ),
        Step(
            "training",
            "the baseline's checkpoint: what it holds, and a plain model loads it",
            0,
            lambda: _tour_checkpoint(folder),
        ),
        Step(
            "training",
            "baseline resumed from its checkpoint to the end",
            1,
            [sys.executable, *train_target("baseline")],
        ),
    ]
    steps += [
        Step(
            "training",
            f"DDP: {n} processes, same global batch",
            n,
            launch.torchrun_command(n, train_target(f"ddp-{n}")),
        )
        for n in sizes
    ]
    steps.append(Step("training", "comparison", 0, lambda: comparison.compare_and_save(folder, sizes)))
    pitfalls = [*LECTURE_PITFALLS, *(["cuda-visible-devices"] if gpus >= 2 else [])]
    steps += [
        Step(
            "pitfalls",
            f"pitfall: {name}, broken then fixed",
            ranks,
            [*lab, "pitfall", name, "--nproc-per-node", str(ranks), "--json", str(folder / f"pitfall-{name}.json")],
        )
        for name in pitfalls
    ]
    host = benchmark_parts.WorkshopHost(gpus, ranks, config_name, set_args, folder)
    for name, part in benchmark_parts.PARTS.items():  # the benchmarks' parts, each sized for this host
        steps += [Step(name, *step) for step in part(host)]
    return steps


def _total_steps(cfg: Config) -> int:
    from lab.run import data
    from lab.run.data.layout import TRAIN_SIZE
    from lab.run.training.plan import plan_steps

    return plan_steps(cfg, 1, data.generated_train_size(cfg.data) or TRAIN_SIZE).total_steps


def _tour_checkpoint(folder: Path) -> None:
    from lab.course.teaching import checkpoint_tour
    from lab.run.training import checkpoint

    tour = checkpoint_tour.describe(folder / "baseline" / "checkpoints" / checkpoint.LAST)
    print(checkpoint_tour.render(tour), flush=True)
    runs.write_json(folder / "checkpoint.json", tour)


def _env(processes: int, on_gpu: bool) -> dict[str, str]:
    env = launch.worker_env(processes)
    if on_gpu:  # the first N devices, as CUDA_VISIBLE_DEVICES=0..N-1 would give
        env.setdefault("CUDA_VISIBLE_DEVICES", ",".join(map(str, range(processes))))
    return env
