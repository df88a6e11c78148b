"""The `layouts` command's table: one line per layout, best first, then what the search did.

Must not know how a layout is searched or estimated (memorymark/analyses/layouts.py), only how
its answer reads.
"""

from __future__ import annotations

from memorymark.analyses.layouts import LayoutRow, LayoutSearch
from memorymark.reporting import layout_code
from memorymark.settings import Settings
from memorymark.units import gib

_HEAD = (
    f"{'layout':<44} {'batch/GPU':>9} {'accum':>5} {'global':>7} {'peak GiB':>8} "
    f"{'bubble':>6} {'step s':>7} {'samples/s/GPU':>13} {'$/run':>9}"
)


def print_layouts(search: LayoutSearch, settings: Settings) -> None:
    """The table, best first, and a line on the work: steps traced, layouts pruned."""
    model, gpu = settings.workload.model, settings.hardware.gpu or "the default GPU"
    if search.counts_tried:
        tried = ", ".join(map(str, search.counts_tried))
        verdict = "the fewest that train" if search.best else "none trains; the largest tried"
        print(
            f"{model}: {search.gpus} GPUs ({verdict}; counts searched: {tried}, "
            f"{search.count_probes} batch-1 steps)"
        )
    else:
        print(f"{model} on {search.gpus} x {gpu}")
    print(_HEAD)
    for row in search.rows:
        print(_line(row))
    for note in dict.fromkeys(r.note for r in search.rows if r.status == "refused" and r.note):
        print(f"refused: {note}")
    print(
        f"memory simulated, time and cost estimated; {search.traced_steps} steps traced, "
        f"{search.pruned} layouts pruned (their states alone, of {gib(search.states_bytes)} "
        f"GiB, pass a GPU), {search.refused_by_shape} refused by the model's shape; "
        f"{search.elapsed_seconds:.1f} s"
    )
    if search.best is not None:
        print(f"best: {search.best.candidate.describe()}; as a torchtitan job config and mesh:")
        code = best_code(search)
        for line in [*code["torchtitan"].splitlines(), "", code["device_mesh"]]:
            print(f"  {line}".rstrip())


def best_code(search: LayoutSearch) -> dict[str, str]:
    """The best layout's torchtitan `[parallelism]` fragment and `init_device_mesh` line
    (memorymark/reporting/layout_code.py); empty when none fits."""
    best = search.best
    if best is None:
        return {}
    return {
        "torchtitan": layout_code.torchtitan_parallelism(
            best.candidate, best.per_gpu_batch, best.global_batch, best.microbatches
        ),
        "device_mesh": layout_code.init_device_mesh_line(best.candidate.layout),
    }


def _line(row: LayoutRow) -> str:
    name = row.candidate.describe()
    if row.worst_rank is not None:
        name += f" [worst rank {row.worst_rank}]"
    if not row.fits:
        shown = row.note if row.status != "refused" else None  # said once, under the table
        what = row.status if shown is None else f"{row.status}: {shown}"
        if row.status == "no fit" and row.peak_bytes is not None:
            what += f" (needs {gib(row.peak_bytes)} GiB)"
        return f"{name:<44} {what}"
    assert row.step_seconds is not None and row.samples_per_second is not None
    per_gpu = row.samples_per_second / row.candidate.layout.gpus
    peak = "-" if row.peak_bytes is None else f"{gib(row.peak_bytes):.1f}"
    cost = "-" if row.usd_per_run is None else f"{row.usd_per_run:,.2f}"
    return (
        f"{name:<44} {row.per_gpu_batch:>9} {row.accumulation:>5} {row.global_batch:>7} "
        f"{peak:>8} {row.bubble_fraction:>6.1%} {row.step_seconds:>7.3f} {per_gpu:>13.2f} "
        f"{cost:>9}"
    )
