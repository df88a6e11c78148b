"""Analyses: questions answered by running the engine more than once.

Owns what would make a model fit when nothing does (`fixes`, with the hardware ways out in
`hardware` and the states' lower bound in `states`; the records they fill, `Fix` and `FitAnswer`,
live beside the report in memorymark/ways_out.py), one model across
the GPU catalog (`compare`), the backward-pass proof (`proof`), and scaling out over GPU counts
(`scale_out`).

Must not know: how one measurement is taken (they ask the engine or a backend), or how anything is
shown.
"""
