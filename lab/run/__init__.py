"""The run wing: one training run and what it stands on (config, cluster, data, training, observability).

Its commands (lab.run.commands): train, rerun, launch, hang, data. It imports nothing of the other wings.
"""
