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
# # Lesson 5: memory per device, and choosing a tool
#
# Lecture 2 of the course, its last part: memory, then choosing a tool. DDP keeps a full copy of the training state on
# every device: parameters, gradients and the optimizer state. With bf16 mixed precision and Adam that is 16 bytes per
# parameter (the ZeRO paper's count: 2 + 2 for the 16-bit parameters and gradients, 12 for the fp32 master weights and
# Adam's two moments). Sharding divides part of that state by the number of devices N: ZeRO-1 the optimizer state,
# ZeRO-2 also the gradients, ZeRO-3 (FSDP's full shard) also the parameters. The question is which tool is the least
# sharding that still fits, since each step of sharding adds communication.
#
# You will:
# 1. estimate a 7B model's memory per device on 8 GPUs under DDP, ZeRO-1, ZeRO-2 and ZeRO-3 / FSDP, against an
#    80 GB H100 and a 141 GB H200;
# 2. check the estimate against a measurement: ResNet-18 trained for a few steps, in one process, then on 2 ranks
#    with DDP and with FSDP;
# 3. ask `lab choose` which tool to use for that model on those GPUs, and why;
# 4. train the lecture's fourth tool, Horovod, beside DDP: the same bytes, the same curve.
#
# The estimate is arithmetic, the same on every machine. The measurement uses a narrow ResNet-18 (width 16) and
# 2 gloo processes on a CPU, and the full-width model (width 64) on a GPU, where "measured" is also
# `torch.cuda.max_memory_allocated`. Every command below is one you can type in the terminal beside this notebook.

# %%
from lab.course.teaching import lesson

folder = lesson.output_dir("05-memory-and-choosing")
plan = lesson.plan()  # with fewer than 2 GPUs, on the CPU: --measure runs 2 ranks, one device each
gpu = plan.gpu
print(plan.why)
width = "64" if gpu else "16"
print(f"measuring ResNet-18 at width {width} on {'GPU' if gpu else 'CPU'}, results in {folder}")

# %% [markdown]
# ## 1. A 7B model on 8 H100s: the estimate, and ResNet-18 measured
# `lab memory` prints bytes per device for each strategy, and whether it fits in the device's memory
# (`--device h100`: 80 GB). `--measure` then trains ResNet-18 a few steps and counts the bytes of its parameter,
# gradient and optimizer-state tensors on each rank, beside the estimate for the same recipe (fp32, SGD with
# momentum: 4 + 4 + 4 bytes per parameter). `--plot` draws the estimate as stacked bars.

# %%
lesson.lab("memory", "--params", "7e9", "--world-size", "8", "--device", "h100", "--measure",
           "--measure-width", width, "--json", str(folder / "memory-h100.json"), "--plot", str(folder / "memory.png"))
lesson.show(folder / "memory.png")

# %% [markdown]
# ## 2. The same model on 8 H200s (141 GB)
# Only the device changes: the bytes per device are the same, the line they must fit under moves.

# %%
lesson.lab("memory", "--params", "7e9", "--world-size", "8", "--device", "h200",
           "--json", str(folder / "memory-h200.json"))

# %% [markdown]
# ## 3. Estimate against measurement
# The measured rows come from `memory-h100.json`. "ratio" is measured / estimate for the model state
# (parameters, gradients, optimizer state). Near 1 means the arithmetic of section 1 counts what torch really
# holds. FSDP's row is each rank's own shard: half of DDP's on 2 ranks.

# %%
measured = lesson.results(folder / "memory-h100.json")["measured"]
estimate = measured["estimate"]
single, two = measured["single"], measured["two_ranks"]
rows = [{"run": "1 process", "estimate MB": estimate["DDP"]["total_bytes"] / 1e6,
         "measured MB": single["total_bytes"] / 1e6, "ratio": single["total_bytes"] / estimate["DDP"]["total_bytes"],
         "peak MB": single["measured_bytes"] / 1e6}]
for name, key, strategy in (("DDP, 2 ranks (per rank)", "ddp", "DDP"),
                            ("FSDP, 2 ranks (per rank)", "fsdp", "ZeRO-3 / FSDP full shard")):
    if key in two:
        rows.append({"run": name, "estimate MB": estimate[strategy]["total_bytes"] / 1e6,
                     "measured MB": two[key]["total_bytes"] / 1e6,
                     "ratio": two[key]["total_bytes"] / estimate[strategy]["total_bytes"],
                     "peak MB": two[key]["measured_bytes"] / 1e6})
lesson.table(rows, ["run", "estimate MB", "measured MB", "ratio", "peak MB"])
print(f"ResNet-18 at width {width}: {single['parameter_count'] / 1e6:.2f}M parameters")

# %% [markdown]
# On a GPU, "peak" is `torch.cuda.max_memory_allocated`: the model state plus activations and workspaces, so it
# is above the estimate, which counts no activations. On a CPU it is the same tensor count as "measured".
#
# ## 4. Which tool? `lab choose`
# `lab choose` walks the lecture's decision tree with these numbers, keeping 10% of each GPU free (CUDA context,
# allocator fragmentation, NCCL buffers): DDP if the whole state fits; else ZeRO-1 if it fits with room, else
# ZeRO-2; else full sharding; else offload or more GPUs. It ends on the `lab train` line to type.

# %%
for device in ("h100", "h200"):
    lesson.lab("choose", "--params", "7B", "--gpus-per-node", "8", "--device", device,
               "--json", str(folder / f"choose-{device}.json"))
choices = {d: lesson.results(folder / f"choose-{d}.json") for d in ("h100", "h200")}
lesson.table([{"device": d, "usable GB": c["usable_bytes"] / 1e9, "choice": c["choice"]["label"],
               "lab train": c["choice"]["lab_train"]} for d, c in choices.items()],
             ["device", "usable GB", "choice", "lab train"])

# %% [markdown]
# ## 5. The lecture's fourth tool: Horovod beside DDP
# Horovod (`dist.strategy=horovod`; `make horovod` builds it) shards nothing: every rank holds the whole replica,
# as under DDP, and its `DistributedOptimizer` averages each gradient from a background thread, fusing small
# ones into one buffer. `lab bench strategies --rows Horovod` trains DDP and Horovod on one config for a few
# steps, each its own job (torchrun for DDP, horovodrun for Horovod), and counts each rank's bytes. Where Horovod
# is not installed, its row says so.

# %%
lesson.lab("bench", "strategies", "--nproc-per-node", "2", "--rows", "Horovod", "--steps", "4",
           "--set", f"model.width={width}", "--json", str(folder / "strategies.json"))
side = {r["label"]: r for r in lesson.results(folder / "strategies.json")["rows"]}
lesson.table([{"strategy": label, "state MiB per rank": r.get("state_bytes", 0) / 2**20,
               "estimate MiB": r.get("estimate_bytes", 0) / 2**20, "images/s": r.get("samples_per_second", ""),
               "loss gap from DDP": r.get("loss_gap_from_ddp", r.get("error", ""))} for label, r in side.items()],
             ["strategy", "state MiB per rank", "estimate MiB", "images/s", "loss gap from DDP"])

# %% [markdown]
# ## What you should see
# Per device, for 7B parameters on 8 devices (16 bytes per parameter): DDP 112 GB, ZeRO-1 38.5 GB, ZeRO-2
# 26.25 GB, ZeRO-3 / FSDP full shard 14 GB. DDP does not fit on an 80 GB H100 and does fit on a 141 GB H200; every
# sharded strategy fits on both. So `lab choose` picks ZeRO-1 on H100s (the least sharding that fits, with room
# for activations) and plain DDP on H200s. The ResNet-18 measurement agrees with the estimate (ratio 1.00 on a
# CPU), and FSDP holds half of DDP's bytes per rank on 2 ranks. Horovod holds exactly DDP's bytes (the same
# replica, and `lab memory`'s DDP row is its estimate) and trains DDP's loss curve (bit for bit on a CPU); its
# place in `lab choose` is the last line: it fits where DDP fits, and its last release is from 2023.
#
# **Ask:** ZeRO-3 uses the least memory; why not always use it?

# %%
h100, h200 = (lesson.results(folder / f"memory-{d}.json") for d in ("h100", "h200"))
total = {r["strategy"]: r["total_bytes"] for r in h100["rows"]}
order = ["DDP", "ZeRO-1", "ZeRO-2", "ZeRO-3 / FSDP full shard"]
lesson.table([{"strategy": s, "GB per device": total[s] / 1e9, "fits 80 GB": total[s] <= 80e9,
               "fits 141 GB": total[s] <= 141e9} for s in order],
             ["strategy", "GB per device", "fits 80 GB", "fits 141 GB"])
lesson.expect([total[s] for s in order] == sorted(total.values(), reverse=True) and len(set(total.values())) == 4,
              "per device: DDP > ZeRO-1 > ZeRO-2 > ZeRO-3 / FSDP full shard ("
              + " > ".join(f"{total[s] / 1e9:g} GB" for s in order) + ")")
lesson.expect(total["DDP"] > 80e9 and h100["recommendation"].startswith("ZeRO-1"),
              f"DDP's {total['DDP'] / 1e9:g} GB per device does not fit on an 80 GB H100; lab memory recommends "
              f"{h100['recommendation']}")
lesson.expect(h200["recommendation"].startswith("DDP"),
              f"on a 141 GB H200 DDP fits, no sharding needed ({h200['recommendation']})")
lesson.expect(total["ZeRO-3 / FSDP full shard"] * 8 == total["DDP"],
              "full sharding over 8 devices divides DDP's bytes by 8 "
              f"({total['DDP'] / 1e9:g} GB / 8 = {total['ZeRO-3 / FSDP full shard'] / 1e9:g} GB)")
ratios = {r["run"]: r["ratio"] for r in rows}
lesson.expect(len(ratios) == 3 and all(0.95 <= v <= 1.10 for v in ratios.values()),
              "ResNet-18 measured / estimate within 0.95-1.10 for 1 process, DDP and FSDP ("
              + ", ".join(f"{k}: {v:.2f}" for k, v in ratios.items()) + ")")
fsdp_share = two["fsdp"]["total_bytes"] / two["ddp"]["total_bytes"] if {"ddp", "fsdp"} <= set(two) else float("nan")
lesson.expect(0.45 <= fsdp_share <= 0.55,
              f"FSDP holds about half of DDP's bytes per rank on 2 ranks ({fsdp_share:.2f})")
lesson.expect([choices["h100"]["choice"]["strategy"], choices["h200"]["choice"]["strategy"]] == ["zero-1", "ddp"],
              f"lab choose: {choices['h100']['choice']['label']} on H100s, "
              f"{choices['h200']['choice']['label']} on H200s")
horovod, ddp = side["Horovod"], side["DDP"]
lesson.expect("not installed" in horovod["error"] if "error" in horovod else
              horovod["state_bytes"] == ddp["state_bytes"] and horovod["loss_gap_from_ddp"] <= (1e-2 if gpu else 0.0),
              horovod.get("error") or f"Horovod holds DDP's {ddp['state_bytes'] / 2**20:.2f} MiB per rank and trains "
              f"its loss curve (largest gap {horovod['loss_gap_from_ddp']:.1e})")

# %% [markdown]
# ## Your turn: shard the model
# This lesson's table says full sharding holds a fraction of DDP's bytes per device; now make a model do it.
# `exercises/shard.py` trains a small model under DDP: put it under FSDP2's `fully_shard` instead, so each rank
# holds 1/N of the parameters, gradients and optimizer state, with the same loss at every step (`TODO(shard)`).
# `lab exercise list`, in a terminal, lists every exercise of the course; this one is `shard` (about 15 minutes).
#
# The next cell copies the starter to `exercises/shard.py`; it never overwrites your work there.

# %%
path = lesson.exercise("shard")

# %% [markdown]
# Open `exercises/shard.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is beside
# `notebooks/`), do its `TODO(shard)`, then run the next cell. The check runs your script and its DDP twin on 2
# ranks and compares the model-state bytes each rank holds and the loss at each step. Each `[ ]` in its checklist
# says what to change: edit, save, and run the cell again until every line is `[x]`.

# %%
result = lesson.check_exercise("shard")
