# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Lesson 1: the baseline and DDP at one global batch
#
# Lecture 1 of the course: data parallelism replicates the model, gives each process a different shard of
# every batch, and averages the gradients (an all-reduce) before each optimizer step. If the **global** batch
# (per-process batch x processes) stays the same, DDP takes the same steps as one process would: the two
# loss curves lie on top of each other. That is the claim this lesson measures.
#
# You will:
# 1. train the single-process baseline;
# 2. train the same config with DDP over several processes (torchrun), each with a share of the batch;
# 3. overlay the two loss curves and read the difference at matching steps.
#
# On a CPU this uses the `smoke` config (a narrow ResNet-18 on synthetic data, seconds per run) and 2 gloo
# processes; on a GPU server `workshop-gpu` and every GPU (NCCL). A host with one GPU runs the CPU way (the
# first cell says so). Every command below is one you can type in the terminal beside this notebook (JupyterLab's
# File > New > Terminal, where `lab` and `torchrun` are on the PATH; in another shell in the checkout, type
# `.venv/bin/lab`).
#
# New words (rank, world size, gloo, NCCL, torchrun, all-reduce, ...) are defined in the
# [glossary](../docs/glossary.md) (`docs/glossary.md` in the lab's checkout), each with the lesson that meets it.

# %%
from lab.course.teaching import lesson

folder = lesson.output_dir("01-baseline-and-ddp")
plan = lesson.plan()  # with fewer than 2 GPUs, 2 CPU processes: DDP needs one device per process
config, n = plan.config, plan.ranks
print(plan.why)
print(f"config {config}, DDP over {n} processes, results in {folder}")

# %% [markdown]
# ## 1. The baseline: one process
# `lab train` without `--nproc-per-node` is one process on one device. Its run directory gets `config.yaml`,
# `manifest.json` (versions, devices, the git revision) and `metrics.jsonl` (one line per logged step).

# %%
lesson.lab("train", "--config", config, "--set", f"run.output_dir={folder}", "--set", "run.id=baseline")

# %% [markdown]
# ## 2. DDP: the same global batch over several processes
# `--nproc-per-node N` starts `torchrun` (its command line is printed). Each process takes 1/N of the global
# batch, the sampler gives it a disjoint shard of the data, and DDP averages the gradients every step.

# %%
lesson.lab("train", "--config", config, "--nproc-per-node", str(n),
           "--set", f"run.output_dir={folder}", "--set", f"run.id=ddp-{n}")

# %% [markdown]
# ## 3. The two curves, overlaid
# The comparison reads both runs' `metrics.jsonl`: loss at the steps both logged, the largest relative
# difference between them, accuracy and images per second. `lab report` draws the curves.

# %%
from lab.course.teaching import comparison

comparison.compare_and_save(folder, [n])
lesson.show(folder / "comparison.md")
lesson.lab("report", str(folder))
lesson.show(folder / "loss.png")

# %% [markdown]
# ## What you should see
# The first logged losses agree to a few hundredths of a percent on a CPU (the check allows 5%): the same
# global batch, the same data order, the same initial weights. They drift apart slowly (about 1.5% by the
# last step here), because BatchNorm normalises over each process's share of the batch, not the global one
# (lesson 2 shows that pitfall and its fixes), and because floating-point sums in a different order round
# differently.
#
# **Ask:** why does the DDP run not take fewer *steps*?

# %%
result = lesson.results(folder / "comparison.json")
first = result["loss_at_matching_steps"][0]
lesson.table(result["loss_at_matching_steps"], ["step", "baseline", f"ddp-{n}", "max_relative_difference"])
lesson.expect(first["max_relative_difference"] < 0.05,
              f"the first matching step's losses agree within 5% (here {first['max_relative_difference']:.2%})")

# %% [markdown]
# ## The same DDP in one file you can read: `examples/ddp_torchrun.py`
# `lab train` keeps its DDP set-up inside the lab's package. `examples/ddp_torchrun.py` (in the checkout, beside
# `notebooks/`) is the whole of it in one plain-PyTorch script you read top to bottom: the process group (gloo on a
# CPU, NCCL on GPUs), a `DistributedSampler` with `set_epoch`, the model in DDP, the loss averaged over ranks, rank 0
# alone writing the checkpoint. `examples/single_device.py` is the same script without DDP, so their diff is every
# change DDP needs. In the terminal beside this notebook:
#
# ```sh
# torchrun --standalone --nproc-per-node 2 examples/ddp_torchrun.py --synthetic 2048 --epochs 2
# diff -u examples/single_device.py examples/ddp_torchrun.py
# ```
#
# [docs/course.md](../docs/course.md#a-ddp-script-you-can-read-examples) walks through the diff line by line.

# %% [markdown]
# ## Your turn: make a script data-parallel
# You have watched DDP train; now write it yourself. `exercises/convert.py` is a plain single-device training script
# (a small CNN, so it runs in seconds on a CPU). Make it run under `torchrun` on 2 processes with everything this
# lesson's DDP run relied on: a process group, a `DistributedSampler` (and `set_epoch`) so each process reads its
# own share of every epoch, the model in `DistributedDataParallel`, `--batch-size` kept as the global batch, and one
# rank writing a checkpoint that loads into a plain model. Every place to change is marked `TODO(ddp)` in the file.
# `lab exercise list`, in the terminal beside this notebook, lists every exercise of the course; this one is
# `convert` (about 25 minutes).
#
# The next cell copies the starter to `exercises/convert.py`; it never overwrites your work there.

# %%
path = lesson.exercise("convert")

# %% [markdown]
# Open `exercises/convert.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is beside
# `notebooks/`), do its `TODO(ddp)`s, then run the next cell. It runs your script under `torchrun` on 2 and on 3
# processes, watches what each rank does, and prints a checklist. Each `[ ]` in its checklist says what to change:
# edit, save, and run the cell again until every line is `[x]`.

# %%
result = lesson.check_exercise("convert")
