"""The measure wing: what a run costs and what it would cost (bench, prediction, sizing, the platform tables).

Its commands (lab.measure.commands): bench ..., predict, memory, choose. It imports the run wing and the ground.
"""
