"""Communication benchmarks: the collectives as nccl-tests measures them, the NCCL settings' sweep, host<->device
copies. Each measures the fabric a training step would use, with no model in it."""
