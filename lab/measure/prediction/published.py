"""Published scaling figures `lab predict --validate` reproduces, each row with the source it is read from, and the
published inputs the prediction starts from (model sizes, one GPU's step time, link speeds). Numbers as published;
a figure no readable source gives is left out, and the row says so.

Sources (read for this module; docs/prediction.md cites them again):
- PYTORCH_DDP: pytorch/pytorch benchmarks/distributed/ddp/README.md: median (p50) seconds per iteration, ResNet-50,
  ResNet-101, ResNeXt-50 32x4d and ResNeXt-101 32x8d, batch 32 per GPU, NCCL, DGX-1 V100 machines with
  "4x 100Gb InfiniBand per machine", 1M/1G ... 2M/8G (machines/GPUs each); and its diff of bucket_cap_mb=1 against
  the default 25 (p75 seconds per iteration with 1 MB buckets).
- HOROVOD: horovod/horovod docs/benchmarks.rst (today: 128 servers x 4 Pascal GPUs, RoCE 25 Gbit/s: 90% Inception V3
  and ResNet-101, 68% VGG-16) and the same page's earlier docs/benchmarks.md (32 servers x 4: 90%, 90%, 79%);
  batch 64 per GPU (the page's tf_cnn_benchmarks command).
- TF_P100: tensorflow/tensorflow tensorflow/docs_src/performance/benchmarks.md, "Details for NVIDIA DGX-1 (NVIDIA
  Tesla P100)", training synthetic data, 1 GPU, batch 64: Inception V3 142 images/s, VGG16 154 (ResNet-101 is not in
  the table: Horovod's ResNet-101 rows have no published one-GPU step and are printed unreproduced).
- Parameter counts: torchvision's model tables (ResNet-50 25.6M, ResNet-101 44.5M, ResNeXt-50 32x4d 25.0M,
  ResNeXt-101 32x8d 88.8M, Inception V3 27.2M, VGG-16 138.4M); TensorFlow's own variants differ by a few percent.
- V100 NVLink: NVIDIA's Tesla V100 datasheet, NVLink 300 GB/s (both directions, 6 links): 150 GB/s a direction.
- DDP_PAPER: Li et al., "PyTorch Distributed: Experiences on Accelerating Data Parallel Training", VLDB 2020: overlap
  of communication with backward speeds ResNet-50 / BERT up by 38.0% / 35.2% on NCCL, 26.8% / 21.5% on Gloo; 25 MB
  default buckets. As issue 41 quoted them: the paper itself was not readable here, nor its per-iteration inputs, so
  these are printed as cited, not reproduced.
- MLPERF: MLPerf Training ResNet-50 on H100, 8 to 3,584 GPUs: time-to-train efficiency 41% at 512 GPUs, as issue 41
  states it (the results table was not readable here). Not an error row: a throughput model over-predicts it, which is
  the lesson (larger global batches need more epochs).
"""

from __future__ import annotations

from dataclasses import dataclass

M = 1e6
PYTORCH_DDP = "pytorch/pytorch benchmarks/distributed/ddp/README.md"
HOROVOD_NOW = "horovod/horovod docs/benchmarks.rst (128 servers x 4 Pascal GPUs)"
HOROVOD_THEN = "horovod/horovod docs/benchmarks.md, earlier revision (32 servers x 4 Pascal GPUs)"
TF_P100 = "tensorflow/tensorflow tensorflow/docs_src/performance/benchmarks.md (DGX-1 P100, synthetic, 1 GPU, batch 64)"
TORCHVISION = "torchvision's model tables"
V100_NVLINK = "NVIDIA Tesla V100 datasheet: NVLink 300 GB/s both directions"
DDP_PAPER = "Li et al., PyTorch Distributed, VLDB 2020, arXiv:2006.15704 (as the lab's issue quoted it, unchecked)"
MLPERF = "MLPerf Training, ResNet-50 on H100 (as the lab's issue stated it; not checked here)"

PARAMS = {  # torchvision's tables
    "resnet50": 25.6 * M,
    "resnet101": 44.5 * M,
    "resnext50_32x4d": 25.0 * M,
    "resnext101_32x8d": 88.8 * M,
    "inception_v3": 27.2 * M,
    "vgg16": 138.4 * M,
}

# one GPU, no DDP, p50 seconds per iteration at batch 32 (the README's "no ddp" rows): the compute the model starts from
DGX1_NO_DDP_SECONDS = {"resnet50": 0.097, "resnet101": 0.162, "resnext50_32x4d": 0.145, "resnext101_32x8d": 0.415}
# p50 seconds per iteration with DDP, 25 MB buckets, by GPUs (machines x GPUs each)
DGX1_DDP_SECONDS = {
    "resnet50": {1: 0.100, 2: 0.103, 4: 0.103, 8: 0.104, 16: 0.104},
    "resnet101": {1: 0.171, 2: 0.176, 4: 0.176, 8: 0.179, 16: 0.179},
    "resnext50_32x4d": {1: 0.147, 2: 0.153, 4: 0.153, 8: 0.157, 16: 0.157},
    "resnext101_32x8d": {1: 0.425, 2: 0.438, 4: 0.439, 8: 0.447, 16: 0.450},
}
# p75 seconds per iteration with bucket_cap_mb=1 (the README's diff, the "test" column)
DGX1_1MB_BUCKET_SECONDS = {
    "resnet50": {1: 0.101, 2: 0.104, 4: 0.105, 8: 0.107, 16: 0.108},
    "resnet101": {1: 0.172, 2: 0.179, 4: 0.180, 8: 0.184, 16: 0.187},
    "resnext50_32x4d": {1: 0.149, 2: 0.156, 4: 0.156, 8: 0.159, 16: 0.161},
    "resnext101_32x8d": {1: 0.427, 2: 0.444, 4: 0.444, 8: 0.452, 16: 0.455},
}
DGX1_GPUS_PER_NODE = 8
DGX1_NODE_NIC_GBPS = 4 * 100.0  # "4x 100Gb InfiniBand per machine" (the README), Gb/s
V100_NVLINK_GBYTES = 150.0  # GB/s a direction
DGX1_BATCH = 32

# Horovod: scaling efficiency by GPUs (4 per server, 25 Gbit/s RoCE per server)
HOROVOD_EFFICIENCY = {
    "inception_v3": {128: 0.90, 512: 0.90},
    "resnet101": {128: 0.90, 512: 0.90},
    "vgg16": {128: 0.79, 512: 0.68},
}
HOROVOD_GPUS_PER_NODE = 4
HOROVOD_NODE_GBITS = 25.0
HOROVOD_BATCH = 64
P100_IMAGES_PER_SECOND = {"inception_v3": 142.0, "vgg16": 154.0}  # TF_P100; ResNet-101 not published there

DDP_PAPER_OVERLAP_SPEEDUP = {("resnet50", "nccl"): 0.380, ("bert", "nccl"): 0.352, ("resnet50", "gloo"): 0.268,
                             ("bert", "gloo"): 0.215}  # fmt: skip
DDP_PAPER_BUCKET_MB = 25

MLPERF_RESNET50_H100_EFFICIENCY_AT_512 = 0.41


@dataclass(frozen=True)
class Row:
    """One published figure to reproduce."""

    table: str  # which table
    label: str  # the row, in the table's words
    published: float
    unit: str  # "s/iter" or "efficiency"
    source: str
