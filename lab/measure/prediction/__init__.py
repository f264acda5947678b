"""`lab predict`: scaling predicted past the machines at hand, and the prediction checked.

model.py       the step-time model: ring and tree all-reduce, bucket pipelining, DDP / ZeRO / FSDP volumes
published.py   published scaling tables with their sources, and the published inputs to reproduce them
validate.py    `lab predict --validate`: each published row predicted, with its error
measured.py    `lab predict`: measure 1..K ranks, predict more, measure them, read the gap
arguments.py   the command line
"""
