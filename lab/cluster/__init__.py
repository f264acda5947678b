"""Processes and machines: the torchrun environment, the process group, launching and stopping workers, the roll call
of hosts, addresses, cores, NVML and `lab doctor`. Below training: nothing here knows what a model is."""
