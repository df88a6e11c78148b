"""GPUs: the catalog (data, each figure with its source), the `GPU` record, and name lookup.

Owns which GPU a name means (`find_gpu`, `custom_gpu`, `detected_gpu`), each GPU's memory, price
and peak rates, the memory PyTorch cannot hand to tensors (CUDA context, cuBLAS workspaces), and
the GPU-level rules (bf16 needs compute capability 8.0). Callers import GPUs from here.

Must not know: torch or any device (the UI and report code read it), workloads, search, or how
anything is displayed.
"""

from memorymark.gpus.catalog import CATALOG
from memorymark.gpus.lookup import (
    UnknownGPUError,
    custom_gpu,
    detected_gpu,
    find_gpu,
    gpu_names,
)
from memorymark.gpus.record import (
    BF16_MIN_CAPABILITY,
    BF16_PRECISIONS,
    DEFAULT_BANDWIDTH_BYTES_PER_S,
    DEFAULT_BF16_TFLOPS,
    DEFAULT_FP32_TFLOPS,
    DEFAULT_SIMULATED_GPU,
    DEFAULT_USD_PER_HOUR,
    GPU,
    MAX_CUSTOM_GIB,
    UNKNOWN_COMPUTE_CAPABILITY,
)
from memorymark.gpus.workspaces import thread_workspace, workspace_allocations

__all__ = [
    "BF16_MIN_CAPABILITY",
    "BF16_PRECISIONS",
    "CATALOG",
    "DEFAULT_BANDWIDTH_BYTES_PER_S",
    "DEFAULT_BF16_TFLOPS",
    "DEFAULT_FP32_TFLOPS",
    "DEFAULT_SIMULATED_GPU",
    "DEFAULT_USD_PER_HOUR",
    "GPU",
    "MAX_CUSTOM_GIB",
    "UNKNOWN_COMPUTE_CAPABILITY",
    "UnknownGPUError",
    "custom_gpu",
    "detected_gpu",
    "find_gpu",
    "gpu_names",
    "thread_workspace",
    "workspace_allocations",
]
