"""What one parameter costs in training state, part by part, and from which ZeRO stage each part is sharded.

A convention is a list of parts (bytes per parameter, the column it shows in, the first ZeRO stage that shards
it): stage 1 shards the optimizer's partition, stage 2 also the 16-bit (or fp32-training) gradients, stage 3
also the parameters the model computes with.

- zero (the ZeRO paper, Rajbhandari et al. 2020, Figure 1): mixed precision is 2 + 2 + K with K = 4 (fp32
  master weights) + the optimizer's fp32 state; 16 for Adam.
- hf (Hugging Face's "model memory anatomy"): mixed precision is 6 (16-bit + fp32 weights) + 4 (fp32 gradients)
  + the state; 18 for Adam. Its fp32 weights and gradients belong to the optimizer's partition, so they shard
  from ZeRO-1 on, as DeepSpeed shards them (stage_1_and_2.py: `single_partition_of_fp32_groups` and its `.grad`
  are this rank's partition); it counts no 16-bit gradient, so its ZeRO-1 and ZeRO-2 rows are equal.
- fp32 training (either convention): 4 + 4 + the state. DeepSpeed still keeps an fp32 master copy of each
  rank's partition (below), FSDP2 steps its shards in place: so ZeRO and FSDP differ in fp32 only.

>>> [(p.column, p.bytes, p.sharded_from) for p in parts("adam", "bf16", "zero")]
[('parameters', 2, 3), ('gradients', 2, 2), ('optimizer_states', 12, 1)]
>>> sum(p.bytes for p in parts("adam", "bf16", "hf")), sum(p.bytes for p in parts("sgd-momentum", "fp32", "zero", True))
(18, 16)
"""

from __future__ import annotations

from typing import NamedTuple

OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd-momentum": 4, "sgd": 0}  # fp32 state per parameter
CONVENTIONS = ("zero", "hf", "deepspeed")  # deepspeed: lab.measure.sizing.deepspeed_estimate, DeepSpeed's own formulas


class Part(NamedTuple):
    column: str  # parameters, gradients or optimizer_states: the estimate table's column
    bytes: int  # per parameter
    sharded_from: int  # the first ZeRO stage that divides it over the ranks (1, 2 or 3)


def parts(optimizer: str, precision: str, convention: str, fp32_master_copy: bool = False) -> list[Part]:
    """The parts of one parameter's training state. `fp32_master_copy`: the strategy keeps an fp32 copy of its
    weight partition even in fp32 training (DeepSpeed's ZeRO-1/2/3; not DDP, not FSDP2).

    Why DeepSpeed keeps it (read in deepspeed 0.19.8): ZeRO-1/2 always clone the partition
    (runtime/zero/stage_1_and_2.py, DeepSpeedZeroOptimizer.__init__: `weights_partition = ...detach().clone()`);
    ZeRO-3 reuses the 16-bit partition only if `fp16_partitioned_groups_flat[i].device == self.device`
    (runtime/zero/stage3.py, DeepSpeedZeroOptimizer_Stage3._create_fp32_partitions), where self.device is the
    accelerator's device *name*, a str ('cpu', 'cuda:0'): a torch.device never equals a str on current torch
    (2.14: `torch.zeros(1).device == 'cpu'` is False), so it clones too. FSDP2's optimizer steps the sharded
    DTensor parameters themselves: no copy. In mixed precision the master copy is already in both conventions.
    """
    state = OPTIMIZER_STATE_BYTES[optimizer]
    if precision == "fp32":
        kept = [Part("parameters", 4, 3), Part("gradients", 4, 2), Part("optimizer_states", state, 1)]
        return kept + ([Part("optimizer_states", 4, 1)] if fp32_master_copy else [])
    if convention == "zero":
        return [Part("parameters", 2, 3), Part("gradients", 2, 2), Part("optimizer_states", 4 + state, 1)]
    if convention == "hf":
        return [
            Part("parameters", 2, 3),
            Part("parameters", 4, 1),
            Part("gradients", 4, 1),
            Part("optimizer_states", state, 1),
        ]
    raise ValueError(f"convention {convention!r}: the per-part conventions are zero and hf")


def bytes_per_parameter(optimizer: str, precision: str, convention: str) -> tuple[int, int, int]:
    """(parameters, gradients, optimizer state) bytes per parameter, unsharded (DDP's), in the convention."""
    by_column = {"parameters": 0, "gradients": 0, "optimizer_states": 0}
    for part in parts(optimizer, precision, convention):
        by_column[part.column] += part.bytes
    return by_column["parameters"], by_column["gradients"], by_column["optimizer_states"]
