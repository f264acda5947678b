#!/usr/bin/env bash
# Does full-width ResNet-18 (the GPU preset) learn the synthetic data, and at which learning rate? Four rates at
# batch 512 (32 steps each), then workshop-gpu as shipped and at a quarter of its rate (96 steps at batch 2048).
# About 80 s on one H200; the losses and test accuracies go to stdout (BENCHMARKS.md, 2026-12-04).
#
#   scripts/lr-sweep.sh [OUT_DIR]        # PYTHON: the interpreter (default python3, as on a GPU host)
set -u
cd "$(dirname "$0")/.."
py=${PYTHON:-python3}; out=${1:-runs/lr-sweep}
common=(--config workshop-gpu --set data.source=synthetic --set data.synthetic_test_size=2048 --set train.amp=bf16
        --set model.channels_last=true --set metrics.port_base=0 --set checkpoint.save=false --set run.output_dir=$out)
for lr in 0.4 0.2 0.1 0.05; do
  echo "== batch 512 lr $lr warmup 12, 32 steps"
  $py -m lab train "${common[@]}" --set run.id=b512-$lr --set data.synthetic_train_size=16384 --set train.global_batch_size=512 \
     --set train.lr=$lr --set train.warmup_steps=12 --set train.max_steps=32 --set train.log_every=4 2>&1 | grep -E "step .*loss|eval|rror"
done
for lr in 1.6 0.4; do
  echo "== workshop-gpu batch 2048 lr $lr warmup 48, 4 epochs of 24 steps"
  $py -m lab train "${common[@]}" --set run.id=b2048-$lr --set data.synthetic_train_size=49152 --set train.lr=$lr \
     --set train.epochs=4 --set train.log_every=8 2>&1 | grep -E "step .*loss|eval|rror"
done
