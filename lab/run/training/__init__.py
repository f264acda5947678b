"""One training run: its lifecycle (`lab train`), the Trainer loop, the strategies it wraps the model with, the model,
optimizer, meter, checkpoints and the run directory (runs, rerun)."""
