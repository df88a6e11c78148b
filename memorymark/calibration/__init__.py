"""Calibration: the simulation checked against a real CUDA GPU, row by row.

Owns running the same settings for real and simulated (`run`), one row and the files rows are
kept in (`record`), and the environment each row was measured in (`environment`).

Must not know: the UI. It is the one place real and simulated figures meet.
"""
