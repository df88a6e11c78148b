"""How the Compare GPUs page shows its rows: a table narrow enough for a laptop, and why fp32
ranks GPUs as it does. Pure functions, no Streamlit.

Owns the table's columns (short names, each saying simulated or estimated; the long meaning
goes in each column's help) and the sentence on TF32. Must not know how the rows were obtained;
imports no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from memorymark.analyses.compare import GpuFit, peak_tflops
from memorymark.settings import Settings

# Column -> its help (the tooltip on the header). Seven short columns fit the main area beside
# the sidebar at 1024 px wide (about 560 px; nine long names needed 1,100 and hid hours and cost):
# usable and total memory and the peak at the max batch are in the sidebar's GPU label,
# `memorymark gpus` and `memorymark compare`.
COLUMN_HELP = {
    "GPU": "The catalog GPU.",
    "Batch (sim.)": "The largest batch that trains on it: simulated on fake tensors, the same "
    "answer Analyze gives.",
    "TFLOP/s": "The peak rate this precision runs matmuls at (datasheets): plain FP32 for fp32 "
    "(TF32 off, PyTorch's default), TF32 with TF32 matmuls on, tensor-core bf16/fp16 otherwise.",
    "$/h": "Catalog on-demand price per GPU-hour.",
    "Speed (est.)": "Samples/s at its max batch over samples/s at your current batch on your "
    "GPU (estimated: each operator's FLOPs and bytes on the GPU's roofline).",
    "h/run (est.)": "Hours per training run: your hours per run on your GPU, divided by the speed.",
    "$/run (est.)": "Cost per training run: hours per run times the price per hour.",
}


def table(rows: Sequence[GpuFit], settings: Settings) -> list[dict[str, Any]]:
    """One row per GPU, under the names of `COLUMN_HELP`."""
    return [
        {
            "GPU": r.gpu.name,
            "Batch (sim.)": r.max_batch,
            "TFLOP/s": round(
                peak_tflops(r.gpu, settings.workload.precision, tf32=settings.workload.tf32), 1
            ),
            "$/h": round(r.usd_per_hour, 2),
            "Speed (est.)": round(r.relative_speed, 2),
            "h/run (est.)": round(r.est_hours_per_run, 2),
            "$/run (est.)": r.est_cost_per_run_usd,
        }
        for r in rows
    ]


def tf32_note(settings: Settings) -> str | None:
    """Why an fp32 run ranks Ampere-and-newer datacenter GPUs low, and how to see TF32's
    figures; None when the run is not fp32."""
    if settings.workload.precision != "32-true":
        return None
    if settings.workload.tf32:
        return (
            "TF32 matmuls are on, as in a script that sets "
            "`torch.backends.cuda.matmul.allow_tf32 = True`: fp32 matmuls run at each GPU's TF32 "
            "rate where it has one (Ampere and newer; estimated as half its fp16 rate, as the "
            "datasheets give it), the plain FP32 rate before. Untick **TF32 matmuls** in the "
            "sidebar for PyTorch's default."
        )
    return (
        "fp32 runs at each GPU's plain FP32 rate: PyTorch leaves TF32 off for matmuls "
        "(`torch.backends.cuda.matmul.allow_tf32 = False` by default since 1.12), so an A100 "
        "(19.5 TFLOP/s FP32) can rank below an A10 (31.2). A script that turns TF32 on "
        "(`allow_tf32 = True`, `torch.set_float32_matmul_precision('high')` or Trainer's "
        "`tf32=True`) gets the TF32 rate (A100: 156, A10: 62.5): tick **TF32 matmuls** in the "
        "sidebar to see those estimates, or choose bf16-mixed precision (A100: 312)."
    )
