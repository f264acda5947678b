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
# # Lesson 4: scaling laws and the levers of a DDP step
#
# Lecture 2 of the course, its second half: how far more processes take you. **Strong scaling** keeps the global
# batch and splits it over N processes; Amdahl's law says a serial fraction s of the one-process time cannot be
# split, so the speedup is S(N) = 1 / (s + (1 - s)/N), at most 1/s. **Weak scaling** keeps the batch per
# process, so the problem grows with N; Gustafson's law S(N) = N - s(N - 1) has no ceiling. For DDP "serial" is
# whatever does not shrink with more ranks: the all-reduce the backward pass does not hide, fixed per-step
# costs. Then the levers that change a step's cost without changing what it computes: precision, gradient
# accumulation, DDP's bucket size.
#
# You will:
# 1. measure strong scaling and fit Amdahl's law; 2. measure weak scaling and fit Gustafson's law;
# 3. time each lever against the plain DDP step, and check that accumulation computes the same update;
# 4. plot all of it with `lab report`; 5. predict a larger world from the smaller ones, then measure it and read
# the gap (and the same model against published tables).
#
# On a CPU this uses the `smoke` config over 1 and 2 gloo processes (one core each: the machine's two) with a
# few timed steps, so the numbers are rough; on a GPU server `workshop-gpu` over 1, 2, 4, ... up to every GPU.

# %%
from lab import scaling_laws
from lab.course.teaching import lesson

folder = lesson.output_dir("04-scaling-and-levers")
plan = lesson.plan()  # with fewer than 2 GPUs, 1 and 2 CPU processes: scaling needs 2 devices or more
n, gpu, config = plan.ranks, plan.gpu, plan.config
print(plan.why)
scaling_args = ["--config", config, "--max-world-size", str(n), "--steps", "40" if gpu else "4",
                "--warmup", "10" if gpu else "1"]
lever_args = ["--config", config, "--nproc-per-node", str(n), "--steps", "10" if gpu else "2", "--rounds", "2",
              "--warmup", "1"]
print(f"config {config}, world sizes up to {n}, results in {folder}")

# %% [markdown]
# ## 1. Strong scaling: one global batch, Amdahl's law
# Each world size 1, 2, 4, ... N is its own torchrun job timing the lab's training step (its command lines are
# printed). The table has images/s, speedup over one process, efficiency = speedup / N, the Karp-Flatt
# serial fraction measured at each N, and the communication share: 1 - (step time under DDP's `no_sync`) /
# (step time with the all-reduce). Then Amdahl's law is fitted to the speedups and projected to 8, 64 and 512
# workers.

# %%
lesson.lab("bench", "scaling", "--mode", "strong", *scaling_args, "--json", str(folder / "scaling-strong.json"))
strong = lesson.results(folder / "scaling-strong.json")

# %% [markdown]
# ## 2. Weak scaling: one batch per process, Gustafson's law
# Now each process keeps its batch, so N processes do N times the work per step. If the step time stayed
# the same, the speedup would be N.

# %%
lesson.lab("bench", "scaling", "--mode", "weak", *scaling_args, "--json", str(folder / "scaling-weak.json"))
weak = lesson.results(folder / "scaling-weak.json")

# %% [markdown]
# ## 3. The two laws against the measurements
# Each law's curve at its fitted serial fraction, beside the measured speedups and the other law at the same
# fraction: the same s costs far less when the problem grows with N. `lab report` draws the same picture.

# %%
table = []
for mode, result, law in (("strong", strong, "amdahl"), ("weak", weak, "gustafson")):
    s = result[law]["serial_fraction"]
    for row in result["rows"]:
        table.append({"mode": mode, "N": row["world_size"], "global batch": row["global_batch_size"],
                      "images/s": row["samples_per_second"], "measured speedup": row["speedup"],
                      "fitted s": s, "Amdahl S(N)": scaling_laws.amdahl_speedup(s, row["world_size"]),
                      "Gustafson S(N)": scaling_laws.gustafson_speedup(s, row["world_size"]),
                      "in the fit": "no (oversubscribed)" if row.get("oversubscribed") else "yes"})
lesson.table(table, list(table[0]))
for mode, law in (("strong", "amdahl"), ("weak", "gustafson")):
    fitted = (strong if mode == "strong" else weak)[law]
    print(f"{law}: s = {fitted['serial_fraction']:.3f}; projected " + ", ".join(
        f"{k}: {p['speedup']:.1f}x" for k, p in sorted(fitted["projection"].items(), key=lambda kv: int(kv[0]))))

# %% [markdown]
# ## 4. The levers
# One torchrun job builds the plain DDP step (fp32, one batch per step, 25 MiB buckets) and one trainer per
# lever on the same ranks and data, and times them in interleaved rounds; every row is a ratio to the plain step
# of the same run. Precision: bf16 autocast (and fp16 on GPUs). Accumulation: k micro-batches of B/k, the first
# k-1 under `no_sync`, against one batch of B, plus a float64 run of both on the same samples. Buckets:
# `bucket_cap_mb` 1 and 100, and gradients not stored as bucket views. "activations" is what autograd saves
# for backward in one forward of one micro-batch. On GPUs it also sweeps NCCL_ALGO, NCCL_PROTO and
# NCCL_P2P_DISABLE; gloo reads no NCCL variable, and the output says so.

# %%
lesson.lab("bench", "levers", *lever_args, "--json", str(folder / "levers.json"))
levers = lesson.results(folder / "levers.json")

# %% [markdown]
# ## 5. The plots
# `lab report` reads the three JSON files: measured speedup against the fitted law (and the other law), where a
# step's time goes at each N (forward + backward, the rest, exposed communication), and each lever's ratio.

# %%
lesson.lab("report", str(folder))
for png in ("scaling-strong.png", "scaling-weak.png", "step-time-strong.png", "levers.png"):
    if (folder / png).exists():
        lesson.show(folder / png)

# %% [markdown]
# ## 6. Predict, then measure, then read the gap
# The laws above describe the world sizes you measured; they know nothing of the network past them. `lab predict`
# models a step instead: compute, the rest, and the all-reduce of the gradients in buckets (ring or tree, a latency
# and a bandwidth term each), hidden behind the backward pass as far as it can be. It measures 1 and 2 ranks,
# takes every input from them (each printed with where it came from), predicts 3 (and more, where there are GPUs
# for them), then measures those to compare, and projects this step to 8, 64 and 512 GPUs of a DGX H100 cluster.
# Then `--validate`: the same model from published inputs alone against PyTorch's own DDP benchmark and Horovod's
# tables, row by row (docs/prediction.md).

# %%
predict_env = {} if gpu and n >= 3 else {"CUDA_VISIBLE_DEVICES": ""}  # 3 ranks or more, else 3 CPU processes
predict_args = (["--config", config, "--check-up-to", str(n), "--steps", "8", "--warmup", "2"] if gpu and n >= 3
                else ["--config", "smoke", "--check-up-to", "3", "--steps", "2", "--warmup", "1"])
lesson.lab("predict", *predict_args, "--json", str(folder / "predict.json"), "--plot", str(folder / "predict.png"),
           env=predict_env)
prediction = lesson.results(folder / "predict.json")
lesson.show(folder / "predict.png")
lesson.lab("predict", "--validate", "--json", str(folder / "predict-validate.json"))
validation = lesson.results(folder / "predict-validate.json")

# %% [markdown]
# ## What you should see
# - Strong scaling on 2 CPU processes: a speedup between 1 and 2, so an Amdahl s between 0 and 1 and a ceiling
#   1/s of a few x. A few timed steps on a 2-core machine are noisy: measured here from 1.05x (s = 0.90) on a
#   busy machine to 1.57x (s = 0.27). On GPUs s is small and the ceiling far away.
# - Weak scaling: a speedup closer to N than strong scaling's, and a smaller s (measured here 1.8x, s = 0.19).
#   A busy machine can even show a speedup above N; the fit then puts s at its bound, 0.
# - The laws table: with two world sizes each law passes through both points exactly (residual 0); the
#   projections to 64 and 512 workers show how differently the same s reads under the two laws.
# - Each fit's serial fraction lies in [0, 1] and uses every world size that had cores of its own.
# - The levers: one row each for bf16, accumulation, bucket 1 MiB, bucket 100 MiB and no bucket views, each
#   as a ratio to plain. Accumulating k micro-batches saves about k times fewer activations per forward and,
#   in float64, ends at the same parameters as one batch up to rounding (about 1e-16). On a CPU bf16 is
#   slower than fp32 (no bf16 matrix units); on H100/H200 it is the fast path.
# - The prediction: every input printed with its source (measured here on 1 and 2 ranks, a platform table, or
#   assumed), then the step predicted and measured at 3 ranks and its error. On a 2-core CPU the 3 processes take
#   turns on the cores, which the model counts (compute grows by 3/2): about 9-10% off on an idle machine, tens of
#   percent on a busy one. The validation prints each row's signed error and side (optimistic or pessimistic):
#   neither side holds more than two thirds, and the bound, set on half of the rows, is checked on the other half
#   (17 of 18 within it); its MLPerf row is the limit of any throughput model: larger global batches need more
#   epochs.
#
# **Ask:** your strong-scaling fit says s = 0.25. How fast can this job ever get, and what does Gustafson say about
# the same s at 8 processes?

# %%
lesson.table([{"lever": r["label"], "what": r["what"], "images/s": r["samples_per_second"],
               "vs plain": r["ratio_to_plain"], "activations (MiB)": r["activation_bytes"] / 2 ** 20,
               "communication share": r["communication_share"]}
              for r in [levers["plain"], *levers["groups"]["precision"], *levers["groups"]["accumulation"]["rows"],
                        *levers["groups"]["buckets"]]],
             ["lever", "what", "images/s", "vs plain", "activations (MiB)", "communication share"])


def fit_check(result: dict, law: str) -> tuple[dict, int, float]:
    """The fit, how many world sizes had cores of their own, and the fit's residual recomputed here."""
    fitted = result[law]
    in_fit = [r for r in result["rows"] if not r.get("oversubscribed")]
    residual = (sum((r["speedup"] - scaling_laws.LAWS[law](fitted["serial_fraction"], r["world_size"])) ** 2
                    for r in in_fit) / len(in_fit)) ** 0.5
    return fitted, len(in_fit), residual


amdahl, amdahl_points, amdahl_residual = fit_check(strong, "amdahl")
gustafson, gustafson_points, gustafson_residual = fit_check(weak, "gustafson")
lesson.expect(0 <= amdahl["serial_fraction"] <= 1 and amdahl["points"] == amdahl_points >= 2
              and abs(amdahl_residual - amdahl["residual_rms"]) < 1e-6,
              f"strong scaling: Amdahl's law fitted over {amdahl_points} world sizes, s = "
              f"{amdahl['serial_fraction']:.3f} in [0, 1], reproducing the speedups with residual "
              f"{amdahl_residual:.3f}")
lesson.expect(0 <= gustafson["serial_fraction"] <= 1 and gustafson["points"] == gustafson_points >= 2
              and abs(gustafson_residual - gustafson["residual_rms"]) < 1e-6,
              f"weak scaling: Gustafson's law fitted over {gustafson_points} world sizes, s = "
              f"{gustafson['serial_fraction']:.3f} in [0, 1], reproducing the speedups with residual "
              f"{gustafson_residual:.3f}")
lesson.expect(len({r["global_batch_size"] for r in strong["rows"]}) == 1
              and len({r["batch_size_per_rank"] for r in weak["rows"]}) == 1
              and [r["global_batch_size"] for r in weak["rows"]]
              == [weak["rows"][0]["global_batch_size"] * r["world_size"] for r in weak["rows"]],
              "strong scaling kept the global batch, weak scaling the batch per process (its global batch grew with N)")
k = levers["accum_steps"]
labels = {r["label"]: r for r in [*levers["groups"]["precision"], *levers["groups"]["accumulation"]["rows"],
                                  *levers["groups"]["buckets"]]}
expected = {"bf16", f"accum-{k}", "bucket-1", "bucket-100", "no-bucket-view"}
lesson.expect(expected <= set(labels) and all(labels[x]["ratio_to_plain"] > 0 for x in expected),
              f"the levers' rows, each a ratio to the plain step: {', '.join(sorted(expected))}")
equivalence = levers["groups"]["accumulation"]["equivalence"]
lesson.expect(equivalence["max_parameter_difference"] < 1e-9,
              f"{k} micro-batches end at the same float64 parameters as one batch "
              f"(largest difference {equivalence['max_parameter_difference']:.1e})")
ratio = labels[f"accum-{k}"]["activation_bytes"] / levers["plain"]["activation_bytes"]
lesson.expect(0.5 / k < ratio < 1.5 / k,
              f"a micro-batch of 1/{k} of the batch saves about 1/{k} of the activations (here {ratio:.3f})")
predicted = [r for r in prediction["rows"] if not r["input"]]
lesson.expect(predicted and all(r["predicted_step_seconds"] > 0 and r["measured_step_seconds"] > 0 for r in predicted)
              and all(a["source"] for a in prediction["assumptions"]),
              "lab predict: " + ", ".join(
                  f"{r['world_size']} ranks predicted {r['predicted_step_seconds'] * 1e3:.0f} ms, measured "
                  f"{r['measured_step_seconds'] * 1e3:.0f} ms ({r['error']:.0%} off)" for r in predicted)
              + ", each input with its source")
sides, held = validation["bias"], validation["halves"]["held_out"]
lesson.expect(max(sides["optimistic"], sides["pessimistic"]) <= 2 / 3 * sides["rows"]
              and held["within_bound"] >= 0.8 * held["rows"],
              f"lab predict --validate: {sides['rows']} published rows, {sides['optimistic']} predicted optimistic and "
              f"{sides['pessimistic']} pessimistic; {held['within_bound']} of the {held['rows']} held out within the "
              f"{validation['bound']:.0%} bound set on the other half")

# %% [markdown]
# ## Your turn: accumulate gradients, one all-reduce per step
# One of this lesson's levers, written by you: gradient accumulation under DDP. `exercises/accumulate.py` already
# runs K micro-batches per optimizer step, but DDP all-reduces the gradients in every backward (K times a step,
# where once would do) and the K micro-batch means add up to K times the large batch's gradient. Fix both (two
# `TODO(accumulate)`s: `model.no_sync()`, and the loss's scale). `lab exercise list`, in a terminal, lists every
# exercise of the course; this one is `accumulate` (about 15 minutes).
#
# The next cell copies the starter to `exercises/accumulate.py`; it never overwrites your work there.

# %%
path = lesson.exercise("accumulate")

# %% [markdown]
# Open `exercises/accumulate.py` in JupyterLab's editor (double-click it in the file browser; `exercises/` is beside
# `notebooks/`), do its `TODO(accumulate)`s, then run the next cell. The check counts DDP's all-reduces between
# optimizer steps and compares your final weights with one process trained on the large batch. Each `[ ]` in its
# checklist says what to change: edit, save, and run the cell again until every line is `[x]`.

# %%
result = lesson.check_exercise("accumulate")
