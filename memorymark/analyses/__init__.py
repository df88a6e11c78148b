"""Analyses: questions answered by running the engine more than once.

Owns what would make a model fit when nothing does (`fixes`, with the changes of settings it
tries in `changes`, the hardware ways out in `hardware` and the time budget in `budget`; the
records they fill, `Fix` and `FitAnswer`, live beside the report in memorymark/ways_out.py), one
model across the GPU catalog (`compare`), the backward-pass proof (`proof`), scaling out over GPU
counts (`scale_out`), the parallel layouts of a count, best first (`layouts`), and the one door
they all come in through (`bench`: the Session hands it to them).

Must not know: how a step is built, measured or counted (they ask the bench; none builds a
backend or a step), or how anything is shown.
"""
