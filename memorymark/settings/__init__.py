"""Settings: everything a user can choose, and nothing else.

Owns the choices (the names each option accepts and the ranges numbers must stay in: `choices`),
the sections that validate themselves (`sections`: `Workload`, what is trained and how the step
runs; `Hardware`, where; `Search`, how batch sizes are searched), the prices only the report reads
(`costs`), each field's help (its docstring, read by `field_docs`), and the codecs (URL query
parameters, a command line) that round-trip exactly (`codecs`).

Must not know: torch, devices, how a step runs or is measured, or how anything is shown. It reads
the GPU and model catalogs to check names, and does no I/O.
"""

from memorymark.settings.choices import HF_OPTIM_NAMES, parse_margin
from memorymark.settings.costs import COST_NAMES, Costs
from memorymark.settings.field_docs import field_help
from memorymark.settings.sections import (
    FIELD_NAMES,
    Hardware,
    Search,
    Settings,
    Workload,
    check_model,
)

__all__ = [
    "COST_NAMES",
    "FIELD_NAMES",
    "HF_OPTIM_NAMES",
    "Costs",
    "Hardware",
    "Search",
    "Settings",
    "Workload",
    "check_model",
    "field_help",
    "parse_margin",
]
