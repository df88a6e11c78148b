"""Analyses: questions answered by running the engine more than once.

Owns what would make a model fit when nothing does (`fixes`), one model across the GPU catalog
(`compare`), the backward-pass proof (`proof`), and scaling out over GPU counts (`scale_out`).

Must not know: how one measurement is taken (they ask the engine or a backend), or how anything is
shown.
"""
