"""Calibration: the simulation checked against a real CUDA GPU, row by row.

Owns running the same settings for real and simulated (`run`), a training loop's first steps
measured and replayed step by step (`loop`), one row and the files rows are kept in (`record`),
and the committed rows re-simulated with the current engine (`repredict`); each row's
environment is memorymark/environment.py's `GpuEnvironment`.

Must not know: the UI. It is the one place real and simulated figures meet.
"""
