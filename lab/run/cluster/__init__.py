"""Processes and machines: the torchrun environment, the process group, launching and stopping workers (and starting
N ranks and gathering their JSON), the roll call of hosts, addresses, cores and NVML. Below training: nothing here
knows what a model is. Judging a host or a fabric is lab.machine.health's."""
