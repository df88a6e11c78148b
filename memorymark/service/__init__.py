"""Service: sweeps as jobs for a server: where they run, with which limits, and what comes back.

Owns a job and its outcome (`jobs`), the executors behind them (`executors`: a bounded local pool
of worker processes, threads, or a Dask cluster), the worker pool and its warm-up (`worker_pool`,
`warmup`), the channels a worker answers through (`channels`), and what the hosting server
allows (`server_config`).

Must not know: Streamlit (the UI drives it) or how a step is measured (workers call the engine).
"""
