"""MemoryMark: the largest batch size that really trains, measured or simulated.

The public API is the front door, `Session` (memorymark/engine.py), with the plain value types it
takes and returns: `Settings` (in sections: `Workload`, what is trained; `Hardware`, where;
`Search`, how batch sizes are searched) and `Costs` say what to analyse; a Session measures one
batch, streams a sweep, and returns a `Report` (the arithmetic: optimal and max batch, waste,
speedup, the plan); a `Measurement` is one batch size's result. A user's own training code,
`Training(model=, batch=, step=, optimizer=)`, is sized by `Session(settings, training=job)`;
its setup code, written for a GPU, runs on a machine without one under `target_gpu(gpu)`.
Importing the package loads no torch; a Session loads it when made. The engine never imports
Streamlit.

    >>> from memorymark import Session, Settings
    >>> Session(Settings(model="tiny-bert", seq_len=32, max_batch=16)).measure(8).fits
    True
"""

# First: it filters a bitsandbytes import notice before anything can import bitsandbytes (peft,
# transformers' Trainer, the engine's quantization), see memorymark/step/quantization.py.
from memorymark.step import quantization as _quantization  # noqa: F401  # isort: skip
from memorymark.backends.target import target_gpu
from memorymark.engine import Session
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.settings import Costs, Hardware, Search, Settings, Workload
from memorymark.step.user_job import SimulationError, Training, simulating

__all__ = [
    "Costs",
    "Hardware",
    "Measurement",
    "Report",
    "Search",
    "Session",
    "Settings",
    "SimulationError",
    "Training",
    "Workload",
    "simulating",
    "target_gpu",
]
__version__ = "0.1.0"
