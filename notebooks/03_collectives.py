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
# # Lesson 3: all-reduce and the other collectives
#
# Lecture 2 of the course: DDP's one piece of communication is an all-reduce of the gradients, and FSDP and
# ZeRO add all-gather and reduce-scatter. A collective's speed is measured the way NVIDIA's nccl-tests measure
# it: **algbw** (algorithm bandwidth) = bytes / time, and **busbw** (bus bandwidth) = algbw x a factor that
# depends on the collective and the number of ranks n, so that busbw can be set beside the speed of the
# hardware link whatever n is. Small messages are bound by latency, large ones by bandwidth.
#
# You will:
# 1. run `lab bench collective all`: all_reduce, all_gather, reduce_scatter, broadcast, alltoall and
#    sendrecv, one after another in one torchrun job, each over a range of message sizes;
# 2. turn algbw into busbw yourself for the largest size, with nccl-tests' factors;
# 3. plot busbw against message size for every collective (`lab report`).
#
# On a CPU this runs 2 gloo processes over sizes from 8 B to 2 MiB (seconds); on a GPU server every GPU over
# NCCL, 8 B to 256 MiB. The same command, typed in the terminal, prints nccl-tests' table for each collective.

# %%
from lab.course.teaching import lesson
from lab.measure.bench.comm.collective import COLLECTIVES, NAMES

folder = lesson.output_dir("03-collectives")
plan = lesson.plan()  # with fewer than 2 GPUs, 2 CPU processes: a collective of one rank moves nothing
n = plan.ranks
print(plan.why)
# -b smallest, -e largest size (bytes, K/M binary), -f step factor, -n timed and -w warm-up iterations per size
sizes = ["-b", "8", "-e", "256M", "-f", "2", "-n", "20", "-w", "5"] if plan.gpu else \
        ["-b", "8", "-e", "4M", "-f", "4", "-n", "5", "-w", "2"]
print(f"{n} ranks, sizes {' '.join(sizes)}, results in {folder}")

# %% [markdown]
# ## 1. Six collectives, one torchrun job
# `--nproc-per-node N` starts torchrun (its command line is printed). With several collectives `--json
# PATH` writes one file per collective, `PATH-OP.json`. Read the columns of each table: `size` as nccl-tests
# counts it for that collective (all_gather: its whole output; reduce_scatter: its whole input), `time` in
# microseconds, `algbw` and `busbw` in GB/s (1e9 bytes), and `#wrong`: elements that differ from the exact
# result (inputs are small integers, so every reduction is exact). Out-of-place writes a separate output
# buffer, in-place overwrites the input; `N/A` marks in-place runs that have no defined result to check.

# %%
lesson.lab("bench", "collective", "all", *sizes, "--nproc-per-node", str(n),
           "--json", str(folder / "collectives.json"))
results = {name: lesson.results(folder / f"collectives-{name}.json") for name in NAMES}

# %% [markdown]
# ## 2. algbw and busbw
# algbw = size / time is what a caller sees. It is not comparable across collectives or world sizes: a ring
# all-reduce of S bytes over n ranks sends 2(n-1)/n x S bytes out of every rank (a reduce-scatter, then an
# all-gather, each (n-1)/n x S), so at n = 8 a link of 100 GB/s gives an all-reduce algbw of only about
# 57 GB/s. nccl-tests multiply by that factor to get busbw, the speed each rank's link actually ran at:
#
# | collective | busbw / algbw |
# |---|---|
# | all_reduce | 2(n-1)/n |
# | all_gather, reduce_scatter, alltoall | (n-1)/n |
# | broadcast, sendrecv | 1 |
#
# The table below takes each collective's largest size, computes algbw from the measured time and applies the
# factor; the last column is what the benchmark itself wrote.

# %%
rows = []
for name, result in results.items():
    last = result["rows"][-1]
    algbw = last["size"] / (last["oop_time_us"] * 1e-6) / 1e9
    factor = COLLECTIVES[name].factor(n)
    rows.append({"collective": name, "size (B)": last["size"], "time (us)": last["oop_time_us"],
                 "algbw (GB/s)": algbw, "factor": COLLECTIVES[name].factor_text, f"at n = {n}": factor,
                 "busbw = algbw x factor": algbw * factor, "busbw written": last["oop_busbw"]})
lesson.table(rows, list(rows[0]))

# %% [markdown]
# ## 3. busbw against message size
# `lab report` reads every `collectives-*.json` in the folder and draws one line per collective (solid:
# out-of-place, dotted: in-place), with a table of each one's average and best busbw. Read the plot from left
# to right: at small sizes the time is the fixed cost of a call (microseconds on NVLink, a fraction of a
# millisecond through gloo's TCP), so busbw is near 0; it rises as the bytes start to dominate and flattens
# where the link (or on a CPU, memory copies) is the limit.

# %%
lesson.lab("report", str(folder))
report = (folder / "report.md").read_text()
lesson.show(folder / "collectives.png")
all_reduce = results["all_reduce"]["rows"]
lesson.table([{"size (B)": r["size"], "time (us)": r["oop_time_us"], "algbw": r["oop_algbw"],
               "busbw": r["oop_busbw"], "#wrong": r["oop_wrong"]} for r in all_reduce],
             ["size (B)", "time (us)", "algbw", "busbw", "#wrong"])

# %% [markdown]
# ## What you should see
# - Every collective's `#wrong` is 0 at every size, out-of-place and in-place (`N/A` where in-place has no
#   defined result): the bytes arrived intact.
# - busbw grows with the message size by orders of magnitude: on 2 gloo processes of a CPU from about
#   0.0000 GB/s at 8 B (the call's fixed cost, a few hundred microseconds) to around 0.3-1.5 GB/s at 2 MiB; on
#   NVLink-connected H100/H200 all_reduce reaches hundreds of GB/s at 256 MiB.
# - At n = 2 the all_reduce factor 2(n-1)/n is 1 and the (n-1)/n factor 0.5; at n = 8 they are 1.75 and
#   0.875.
#
# **Ask:** on 8 GPUs an all-reduce of 1 GiB takes 6 ms. What are algbw and busbw, and which one do you compare with
# NVLink's 450 GB/s per direction?

# %%
wrong = {name: sum(r["oop_wrong"] + (r["ip_wrong"] or 0) for r in result["rows"]) for name, result in results.items()}
growth = {}
for name, result in results.items():
    first, last = result["rows"][0], result["rows"][-1]
    growth[name] = (max(last["oop_busbw"], last["ip_busbw"]) /
                    max(first["oop_busbw"], first["ip_busbw"], 1e-12))
lesson.table([{"collective": name, "#wrong": wrong[name], "sizes": len(results[name]["rows"]),
               "busbw largest / smallest size": growth[name]} for name in NAMES],
             ["collective", "#wrong", "sizes", "busbw largest / smallest size"])
lesson.expect(len(results) == 6 and all(w == 0 for w in wrong.values()),
              "all six collectives ran and every one has #wrong = 0 at every size")
lesson.expect(all(g > 10 for g in growth.values()),
              f"busbw at the largest size is more than 10x busbw at the smallest, for every collective "
              f"(smallest ratio here {min(growth.values()):.0f}x)")
lesson.expect("## Collectives: bus bandwidth by operation" in report
              and (folder / "collectives.png").stat().st_size > 0,
              "lab report drew the collectives' busbw plot and table")

# %% [markdown]
# ## Your turn: all-reduce around a ring
# This lesson measured all-reduce; now write it. In `exercises/ring_allreduce.py` you build all-reduce from
# point-to-point messages around a ring: each rank sends only to its right neighbour and receives only from its
# left, the tensor cut in one chunk per rank, first a reduce-scatter, then an all-gather. Each rank then sends
# 2(n-1)/n of the tensor, the all_reduce factor in this lesson's busbw. The places to fill in are marked
# `TODO(ring)`. `lab exercise list`, in a terminal, lists every exercise of the course; this one is `ring-allreduce`
# (about 25 minutes).
#
# The next cell copies the starter to `exercises/ring_allreduce.py`; it never overwrites your work there.

# %%
path = lesson.exercise("ring-allreduce")

# %% [markdown]
# Open `exercises/ring_allreduce.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is
# beside `notebooks/`), do its `TODO(ring)`s, then run the next cell. The check calls your `ring_all_reduce` on 2, 3
# and 4 ranks, with sizes that do not divide by the world size, compares each result with `dist.all_reduce`'s, and
# times yours beside it. Each `[ ]` in its checklist says what to change: edit, save, and run the cell again until
# every line is `[x]`.

# %%
result = lesson.check_exercise("ring-allreduce")

# %% [markdown]
# ## Your turn: DDP itself, and its overlap
# DDP is the all-reduce you just wrote, used well: it broadcasts rank 0's weights once, then, in every backward, puts
# the gradients in buckets (the last layer's first: the backward makes them first) and launches each bucket's
# all-reduce *while the backward is still computing the earlier layers*. That overlap is why DDP scales. In
# `exercises/own_ddp.py` you write `MyDDP(module, bucket_mb)`: the broadcast, a hook per parameter
# (`register_post_accumulate_grad_hook`), buckets, `dist.all_reduce(..., async_op=True)` from the hook, and a
# `finish()` that waits, averages and copies back before the optimizer step. First with `bucket_mb=0` (an
# all-reduce per parameter), then with buckets. The places are marked `TODO(own-ddp)`; this one is `own-ddp` (about
# 40 minutes).

# %%
path = lesson.exercise("own-ddp")

# %% [markdown]
# Do the `TODO(own-ddp)`s, then run the next cell. The check builds its own model (with a frozen first layer), gives
# every rank different weights, and on 2, 3 and 4 ranks measures from outside your code: that rank 0's weights
# reached every rank, your weights after 3 steps against one process on the whole batch, the all-reduces a step
# against the parameters (stage 1) and the buckets 0.3 MiB makes (stage 2), how many of them were in flight while the
# backward computed more gradients (the overlap), and your step time beside torch's DDP on the same model.

# %%
result = lesson.check_exercise("own-ddp")
