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
# # Lesson 2: the four pitfalls, broken then fixed
#
# Lecture 1's list of common DDP mistakes. Each one runs without an error message and does something wrong
# between the ranks: the data order, the checkpoint file, the BatchNorm statistics, the collective a rank waits
# in. `lab pitfall NAME` runs the mistake and then the fix in real torchrun processes and measures the symptom
# in both, so you see it appear and disappear.
#
# You will:
# 1. `set-epoch`: a `DistributedSampler` without `set_epoch(epoch)` repeats epoch 0's order every epoch;
# 2. `checkpoint-every-rank`: every rank saving one path writes N times the bytes, tears the file for a
#    reader, and a DDP `state_dict()` carries a `module.` prefix a plain model refuses;
# 3. `batchnorm`: the ranks keep their own BatchNorm running statistics, so the same weights evaluate
#    differently on each rank;
# 4. `uneven-batches`: a rank with one more batch waits in DDP's all-reduce until the timeout.
#
# Each section prints the command's output (its table, then "Why:") and shows the broken-vs-fixed table
# inline. On a CPU every pitfall uses 2 gloo processes; on a GPU server every GPU (`uneven-batches` always
# runs on gloo, where a timed-out collective can be reported instead of aborting the process).

# %%
from lab.course.teaching import lesson

folder = lesson.output_dir("02-pitfalls")
plan = lesson.plan()  # with fewer than 2 GPUs, 2 CPU processes: a pitfall needs 2 ranks or more
n = plan.ranks
print(plan.why)
PITFALLS = ["set-epoch", "checkpoint-every-rank", "batchnorm", "uneven-batches"]


def command(name: str) -> list[str]:
    return ["pitfall", name, "--nproc-per-node", str(n), "--json", str(folder / f"{name}.json")]


def pitfall(name: str) -> dict:
    """`lab pitfall NAME`: its output, then its broken-vs-fixed table inline; returns its JSON."""
    lesson.lab(*command(name))
    result = lesson.results(folder / f"{name}.json")
    columns = ["measured", *result["table"]["columns"]]
    lesson.table([dict(zip(columns, row)) for row in result["table"]["rows"]], columns)
    return result


print(f"{n} processes per pitfall, results in {folder}")

# %% [markdown]
# ## 1. `set-epoch`: the sampler's shuffle is seeded by the epoch
# `DistributedSampler` shuffles with `seed + epoch`, and the epoch is whatever `set_epoch` last set. Without
# the call every epoch is epoch 0: the same permutation, so each rank sees the same half of the data in the same
# order every epoch. The job trains a small model for 5 epochs both ways and records each rank's order.

# %%
set_epoch = pitfall("set-epoch")

# %% [markdown]
# ## 2. `checkpoint-every-rank`: one writer, an atomic write, no `module.` prefix
# After a DDP step every rank holds the same weights, so one copy is enough. The broken side has every rank
# call `torch.save` on one shared path, repeatedly, while a reader thread loads the file; the fixed side saves
# from rank 0 into a temporary file, `os.replace`s it over the old one and waits at a barrier. It also loads
# `ddp.state_dict()` into a plain model (every key starts with `module.`) and then `ddp.module.state_dict()`.

# %%
checkpoint = pitfall("checkpoint-every-rank")

# %% [markdown]
# ## 3. `batchnorm`: DDP averages gradients, never buffers
# A BatchNorm layer's running mean and variance are buffers. The job gives each rank different classes of
# data (its shard) and trains with `broadcast_buffers=False`: the weights stay identical (DDP's all-reduce),
# the statistics do not, so evaluating the same weights on the same test set gives a different loss per rank.
# The fixes: `broadcast_buffers=True` (DDP's default: rank 0's buffers copied to every rank each forward),
# GroupNorm (no running statistics), and SyncBatchNorm (statistics over all ranks; CUDA only).

# %%
batchnorm = pitfall("batchnorm")

# %% [markdown]
# ## 4. `uneven-batches`: a collective completes only when every rank joins it
# Rank 0 gets 5 batches, rank 1 gets 4. After its 4th step rank 1 leaves the loop; rank 0's 5th backward
# starts DDP's gradient all-reduce and waits for a partner that never comes. The job sets a 5 s process-group
# timeout (gloo's default is 30 minutes, NCCL's 10) so the hang ends in an error you can read. The fixes:
# `Join([ddp])`, which lets a finished rank shadow the collectives, and a `DistributedSampler` that gives
# every rank the same count by repeating samples (`drop_last=False`) or dropping the tail (`drop_last=True`).

# %%
uneven = pitfall("uneven-batches")

# %% [markdown]
# ## 4b. The hang named: which rank, which collective, which line
# A timeout says *that* a collective waited, not who kept it waiting. Every run the lab starts records each
# rank's collectives (PyTorch's Flight Recorder) and watches its main thread; when nothing moves for
# `dist.hang_seconds`, one rank gathers every rank's record and prints who waits in which collective (its number,
# operation, sizes and line), who never came, who is in another collective, who died. Here a planted mistake:
# rank 1 calls `all_gather` where rank 0 calls `all_reduce`, the third collective of each. `dist.hang_seconds`
# is 3 s and the timeout 10 s, so the block comes first, then the timeout's tracebacks.

# %%
import shutil

hang_folder = folder / "hang"
shutil.rmtree(hang_folder, ignore_errors=True)  # this cell's own: a run before it left its diagnosis there
lesson.lab("launch", "--nproc-per-node", "2", "--", "-m", "lab.course.pitfalls.planted_hang", "--plant", "other",
           "--timeout", "10", "--hang", "3", check=False, env={"LAB_HANG_DIR": str(hang_folder)})
hung = lesson.results(hang_folder / "hang.json")
lesson.table([{"rank": r["rank"], "state": r["state"], "collective": f"{r.get('op')} #{r.get('seq')}",
               "line": f"{r['where']['file']}:{r['where']['line']}" if r.get("where") else ""}
              for r in hung["ranks"]], ["rank", "state", "collective", "line"])
print(f"lab hang {hang_folder} shows it again")

# %% [markdown]
# ## 5. On a GPU server: `cuda-visible-devices`
# Which GPU each process lands on with and without `CUDA_VISIBLE_DEVICES`: without it and without
# `torch.cuda.set_device(local_rank)` every rank works on GPU 0. It needs 2 or more GPUs, so on a CPU this
# cell only says so.

# %%
if plan.gpu:
    visible = pitfall("cuda-visible-devices")
else:
    print("skipped: cuda-visible-devices needs 2 or more GPUs; this machine runs the lesson on CPU processes")

# %% [markdown]
# ## What you should see
# Every mistake shows its symptom and every fix removes it:
# - `set-epoch`: without the call 100% of the later epochs repeat epoch 0's order (1 distinct order per rank),
#   with it 0% (5 distinct orders in 5 epochs); rank 0 sees about half the data set without it, nearly all of
#   it with it. The test loss barely differs on this toy: the bug is silent.
# - `checkpoint-every-rank`: N times the file's bytes per save (2.00x on 2 ranks) against 1.00x, the reader
#   fails on a torn file many times against 0, and 8 missing / 9 unexpected keys against 0 / 0.
# - `batchnorm`: running means differ between the ranks by about 1.8 and the test accuracy by a few percent on
#   identical weights; with `broadcast_buffers=True` or GroupNorm the difference is exactly 0.
# - `uneven-batches`: rank 0 times out after 5 s in the all-reduce of step 5; Join, padding and `drop_last`
#   all complete, with equal weights on every rank.
# - the planted hang: within 3 s a block names rank 0 waiting in `all_reduce` #3 and rank 1 in `all_gather` #3,
#   each with its line of `lab/course/pitfalls/planted_hang.py`; the run then fails at its 10 s timeout.
#
# **Ask:** in the batchnorm run the weights are identical on both ranks (difference 0), yet the test accuracy
# differs. Why, and why is `broadcast_buffers=True` only half a fix?

# %%
records = {"set-epoch": set_epoch, "checkpoint-every-rank": checkpoint, "batchnorm": batchnorm,
           "uneven-batches": uneven}
fb = batchnorm["fixed"]["broadcast_buffers"]
lesson.table([
    {"pitfall": "set-epoch", "measured": "later epochs repeating epoch 0's order",
     "broken": f"{set_epoch['broken']['repeat_share']:.0%}", "fixed": f"{set_epoch['fixed']['repeat_share']:.0%}"},
    {"pitfall": "checkpoint-every-rank", "measured": "bytes per save, x the file",
     "broken": f"{checkpoint['broken']['bytes_ratio']:.2f}x", "fixed": f"{checkpoint['fixed']['bytes_ratio']:.2f}x"},
    {"pitfall": "checkpoint-every-rank", "measured": "reader's torn loads",
     "broken": f"{checkpoint['broken']['reader']['torn']} of {checkpoint['broken']['reader']['loads']}",
     "fixed": f"{checkpoint['fixed']['reader']['torn']} of {checkpoint['fixed']['reader']['loads']}"},
    {"pitfall": "checkpoint-every-rank", "measured": "missing keys in a plain model",
     "broken": checkpoint["broken"]["module_prefix"]["missing_keys"],
     "fixed": checkpoint["fixed"]["module_prefix"]["missing_keys"]},
    {"pitfall": "batchnorm", "measured": "running_mean difference between ranks",
     "broken": f"{batchnorm['broken']['running_mean_spread']:.3f}", "fixed": f"{fb['running_mean_spread']:.3f}"},
    {"pitfall": "batchnorm", "measured": "test loss difference between ranks",
     "broken": f"{batchnorm['broken']['test_loss_spread']:.4f}", "fixed": f"{fb['test_loss_spread']:.4f}"},
    {"pitfall": "uneven-batches", "measured": "outcome",
     "broken": f"rank {uneven['broken']['waiting_rank']} timed out after {uneven['broken']['waited_seconds']:.1f} s"
     if uneven["broken"]["timed_out"] else "did not time out",
     "fixed": ", ".join(f"{k} {'completed' if v['completed'] else 'FAILED'}" for k, v in uneven["fixed"].items())},
], ["pitfall", "measured", "broken", "fixed"])

lesson.expect(set_epoch["broken"]["repeat_share"] == 1.0 and set_epoch["fixed"]["repeat_share"] == 0.0,
              "set-epoch: every later epoch repeats epoch 0's order without set_epoch, none with it")
lesson.expect(abs(checkpoint["broken"]["bytes_ratio"] - n) < 0.05
              and abs(checkpoint["fixed"]["bytes_ratio"] - 1) < 0.05,
              f"checkpoint-every-rank: {n} ranks write {n}x the file's bytes per save, rank 0 alone 1x "
              f"(here {checkpoint['broken']['bytes_ratio']:.2f}x and {checkpoint['fixed']['bytes_ratio']:.2f}x)")
lesson.expect(checkpoint["fixed"]["reader"]["loads"] > 0 and checkpoint["fixed"]["reader"]["torn"] == 0
              and checkpoint["broken"]["module_prefix"]["missing_keys"] > 0
              and checkpoint["fixed"]["module_prefix"]["missing_keys"] == 0,
              "checkpoint-every-rank: the atomic write is never read torn, and only the 'module.' keys miss")
lesson.expect(batchnorm["broken"]["running_mean_spread"] > 0.1 and batchnorm["broken"]["weight_spread"] == 0
              and fb["running_mean_spread"] == 0 and fb["test_loss_spread"] == 0,
              f"batchnorm: identical weights, running means {batchnorm['broken']['running_mean_spread']:.2f} apart "
              f"without broadcast_buffers, 0 with it")
lesson.expect(uneven["broken"]["timed_out"] and all(f["completed"] and f["weights_equal"]
                                                    for f in uneven["fixed"].values()),
              "uneven-batches: the plain loop times out; Join, padding and drop_last all complete with equal weights")
states = {r["rank"]: r for r in hung["ranks"]}
lesson.expect(states[0]["state"] == "waiting" and states[0]["op"] == "all_reduce"
              and states[1]["state"] == "mismatch" and states[1]["op"] == "all_gather"
              and states[0]["seq"] == states[1]["seq"],
              f"the planted hang: rank 0 waits in all_reduce #{states[0]['seq']}, rank 1 is named in all_gather at the "
              f"same number, each with its line")
lesson.expect(all(r["demonstrated"] for r in records.values()),
              "all four pitfalls report 'demonstrated: yes'")

# %% [markdown]
# ## Your turn: fix each pitfall yourself
# Four short scripts, each with one of this lesson's pitfalls in it: run it, see the symptom, fix it. Each has its
# own file in `exercises/`, its `TODO`s marking where to look, and its own check, which runs your script under
# `torchrun` on 2 processes and measures what each rank did. `lab exercise list`, in a terminal, lists them with
# every other exercise of the course. A check that fails does not stop the notebook: its checklist says what to
# change.

# %% [markdown]
# ### fix-set-epoch (about 5 minutes)
# Every epoch of this DDP loop reads the data in the same order, as in `set-epoch` above. Give each epoch an order
# of its own (`TODO(set-epoch)`). The next cell copies the starter to `exercises/fix_set_epoch.py`; it never
# overwrites your work there.

# %%
path = lesson.exercise("fix-set-epoch")

# %% [markdown]
# Open `exercises/fix_set_epoch.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is
# beside `notebooks/`), do its `TODO(set-epoch)`, then run the next cell. The check counts the samples each rank
# reads in each epoch. Each `[ ]` in its checklist says what to change: edit, save, and run the cell again until
# every line is `[x]`.

# %%
result = lesson.check_exercise("fix-set-epoch")

# %% [markdown]
# ### fix-checkpoint (about 10 minutes)
# Every rank writes the checkpoint to one file at once, the others read it before it is whole, and it does not load
# into a plain model: `checkpoint-every-rank` above. Make one rank write it, the others wait, and the file load into
# a model without DDP (three `TODO(checkpoint)`s). The next cell copies the starter to
# `exercises/fix_checkpoint.py`.

# %%
path = lesson.exercise("fix-checkpoint")

# %% [markdown]
# Open `exercises/fix_checkpoint.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is
# beside `notebooks/`), do its `TODO(checkpoint)`s, then run the next cell. The check watches every `torch.save` and
# `torch.load` of every rank. Each `[ ]` in its checklist says what to change: edit, save, and run the cell again
# until every line is `[x]`.

# %%
result = lesson.check_exercise("fix-checkpoint")

# %% [markdown]
# ### fix-batchnorm (about 10 minutes)
# The same weights on every rank, and a different test loss on each: the `batchnorm` pitfall above. Make every
# rank keep the BatchNorm statistics of the global batch, all ranks' samples together (`TODO(batchnorm)`): making
# the ranks agree is not enough, which is the Ask's half fix. SyncBatchNorm runs on GPUs only; on the CPU the
# all-reduce is yours to write. The next cell copies the starter to `exercises/fix_batchnorm.py`.

# %%
path = lesson.exercise("fix-batchnorm")

# %% [markdown]
# Open `exercises/fix_batchnorm.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is
# beside `notebooks/`), do its `TODO(batchnorm)`, then run the next cell. The check compares the BatchNorm running
# statistics every rank holds at the end with each other and with the global batch's. Each `[ ]` in its checklist
# says what to change: edit, save, and run the cell again until every line is `[x]`.

# %%
result = lesson.check_exercise("fix-batchnorm")

# %% [markdown]
# ### fix-uneven (about 10 minutes)
# Rank 0's shard holds one batch more than the others', and the run never ends: `uneven-batches` above. Make it end,
# with every rank holding the same weights (`TODO(uneven)`). The next cell copies the starter to
# `exercises/fix_uneven.py`.

# %%
path = lesson.exercise("fix-uneven")

# %% [markdown]
# Open `exercises/fix_uneven.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is beside
# `notebooks/`), do its `TODO(uneven)`, then run the next cell. The check stops a run that hangs (30 s without
# progress, or at its 120 s limit), so a hang fails a check rather than stopping the notebook. Each `[ ]` in its
# checklist says what to change: edit, save, and run the cell again until every line is `[x]`.

# %%
result = lesson.check_exercise("fix-uneven")
