"""Calibration: the simulation checked against a real CUDA GPU, row by row.

Owns running the same settings for real and simulated (`run`), and one row and the files rows
are kept in (`record`); each row's environment is memorymark/environment.py's `GpuEnvironment`.

Must not know: the UI. It is the one place real and simulated figures meet.
"""
