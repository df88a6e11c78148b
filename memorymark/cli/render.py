"""The command line's text: the engine's answers as the lines the CLI prints.

Owns how a report, a probe, a measurement, the backward-pass proof, the GPU-count search, a
calibration row and the environment stamp read on a terminal, and the one-line warnings and JSON
printing every command shares. `commands` (which runs the engine) and `history` (which only
reads saved runs) both print through it, so a saved run shows exactly as `analyze` showed it.
Must not know how anything is run: no engine, no torch; it takes plain values (Report,
Measurement, ...) and the report's `analyze --json` object, built once by its caller.
"""

from __future__ import annotations

import json
import sys
from typing import TYPE_CHECKING, Any

from memorymark.analyses.proof import FAIL_BELOW, PASS_FROM
from memorymark.measurement import Measurement, ValueRead, memory_source
from memorymark.report import Report
from memorymark.reporting import exports
from memorymark.settings import Settings
from memorymark.step import paging
from memorymark.units import gib, plural
from memorymark.ways_out import Fix

if TYPE_CHECKING:
    from memorymark.analyses.proof import BackwardProof
    from memorymark.calibration.record import CalibrationRow
    from memorymark.gpus import GPU
    from memorymark.search.gpu_count import GpuSearch


def print_json(data: Any) -> None:
    """One JSON value on stdout, and nothing else."""
    print(json.dumps(data, indent=2))


def warn(message: str) -> None:
    """A one-line warning on stderr (a damaged database moved aside, a run not saved)."""
    print(f"memorymark: warning: {message}", file=sys.stderr)


def header_line(subject: str, gpu: GPU, backend: str, source: str, ranks: str = "") -> str:
    """The line a sweep starts with: what is searched, on which GPU (and how many, `ranks`),
    measured or simulated, and the memory it may use."""
    return (
        f"{subject} on {gpu.name}{ranks} ({backend}, {source}): usable {gpu.usable_gib:.2f} of "
        f"{gpu.total_gib:.2f} GiB" + (" per rank" if ranks else "")
    )


def ranks_text(s: Settings) -> str:
    """How many GPUs, over how many nodes, with which strategy (for a run on many GPUs)."""
    hw = s.hardware
    how = hw.dist
    if hw.model_parallel > 1 and hw.gpu_count:
        how = hw.layout(hw.gpu_count).describe()  # "FSDP 4 x TP 2", as torchtitan logs it
    return f" x{hw.gpu_count} ({plural(hw.node_count, 'node')}, {how})"


def environment_line(report: Report) -> str:
    """The environment stamp in one line: versions, where it ran, and when it finished."""
    env = exports.environment(report)
    return (
        f"MemoryMark {env['memorymark_version']}, torch {env['torch_version']}, transformers "
        f"{env['transformers_version']}, Python {env['python_version']}; finished "
        f"{env['finished_utc']}"
    )


def probe_line(m: Measurement, usable_bytes: int) -> str:
    """One line per probe: the verdict, peak and reserved bytes, and what an OOM would need (or
    why it ran out, when that was below the capacity)."""
    status = "fits" if m.fits else ("runs" if m.runs else "OOM ")
    reserved = m.cuda_reserved_bytes
    held = "" if reserved is None or not m.runs else f"  reserved {gib(reserved):8.3f} GiB"
    rate = ""
    if m.samples_per_second is not None:
        rate = f"  {m.samples_per_second:9.1f} samples/s ({m.throughput_source})"
    if not m.runs:
        if m.required_bytes is not None and m.required_bytes > usable_bytes:
            need = f"  needs {gib(m.required_bytes):.1f} GiB of {gib(usable_bytes):.1f}"
        else:
            # Below the capacity (or unknown), a bare "needs" figure would read as a fit.
            need = f"  ({m.why_not(usable_bytes)})"
        return f"  batch {m.batch_size:>6}  {status}{need}{_replayed(m)}"
    share = 100 * (m.required_bytes or m.peak_bytes) / usable_bytes
    why = f"  ({m.held_back})" if m.held_back else ""
    return (
        f"  batch {m.batch_size:>6}  {status}  peak {gib(m.peak_bytes):8.3f} GiB{held}  "
        f"({share:5.1f}%){rate}{why}{_replayed(m)}"
    )


def _replayed(m: Measurement) -> str:
    """Marks a probe read off traced steps (the symbolic search) rather than traced."""
    return "  [replayed]" if m.replayed else ""


def seq_probe_line(seq_len: int, m: Measurement, usable_bytes: int) -> str:
    """A sequence-length search's probe: `probe_line` led by the sequence length tried."""
    line = probe_line(m, usable_bytes)
    return line.replace(f"batch {m.batch_size:>6}", f"seq {seq_len:>7}", 1)


def print_gpu_search(search: GpuSearch) -> None:
    """Each GPU count tried for batch 1, and the fewest on which it fits."""
    if search.ruled_out_below is not None and search.states_bytes is not None:
        print(
            f"  fewer than {plural(search.ruled_out_below, 'GPU')} not stepped: a rank's share "
            f"of the sharded states alone ({gib(search.states_bytes):,.1f} GiB in all) passes "
            "its memory"
        )
    for n, m in search.tried:
        need = "" if m.needs_bytes is None else f", needs {gib(m.needs_bytes):.1f} GiB"
        verdict = "fits" if m.fits else ("runs, past the margin" if m.runs else "does not run")
        print(f"  {plural(n, 'GPU'):>10}: batch 1 {verdict}{need}")
    if search.min_gpus is None:
        most = plural(max(n for n, _ in search.tried), "GPU")
        print(f"  no count up to {most} fits batch 1")
    else:
        print(f"  min_gpus = {search.min_gpus} (simulated, batch 1 fits)")


def print_measurement(m: Measurement) -> None:
    """`measure`'s answer: the verdict, peak and reserved bytes, and what the peak is made of."""
    source = memory_source(m.measured)
    verdict = "fits" if m.fits else ("runs, not recommended" if m.runs else "out of memory")
    need = "" if m.required_bytes is None else f", reserved {gib(m.required_bytes):.3f} GiB"
    print(
        f"batch {m.batch_size}: {verdict}, peak {gib(m.peak_bytes):.3f} GiB{need} "
        f"({source}, {m.backend})"
    )
    if m.breakdown:
        for name, n_bytes in m.breakdown.to_dict().items():
            print(f"  {name:<16} {gib(n_bytes):8.3f} GiB")
    for line in _weight_and_paging_lines(m):
        print(f"  {line}")
    for stage in m.stages:
        worst = " (worst)" if m.stages[m.worst_stage or 0] is stage else ""
        print(
            f"  pipeline rank {stage.pp_rank} (rank {stage.rank}, stages "
            f"{', '.join(map(str, stage.stages))}, microbatch {stage.micro_batch}): peak "
            f"{gib(stage.peak_bytes):.3f} GiB{worst}"
        )
    if m.eval_peak_bytes is not None:
        print(f"  evaluation pass peak {gib(m.eval_peak_bytes):.3f} GiB (training state included)")
    if m.error:
        print(f"  {m.error}")
    _print_value_reads(m.value_reads)


def _print_value_reads(reads: tuple[ValueRead, ...]) -> None:
    """Where a user's step read a value the simulation answered with zero (control flow after
    it followed that zero)."""
    for read in reads:
        print(f"  value read as 0 (simulated): {read.where}")


def print_proof(proof: BackwardProof) -> None:
    """`validate-backward`'s answer: each protocol's peak, then the ratio and its verdict."""
    for r in proof.results:
        extra = "" if r.max_batch is None else f"   max batch {r.max_batch}"
        print(f"{r.label:<42} {gib(r.peak_bytes):8.3f} GiB{extra}")
    print(
        f"forward+backward / forward-only = {proof.ratio:.2f}x  {proof.verdict}"
        f"  (PASS from {PASS_FROM}x, FAIL below {FAIL_BELOW}x; memory {proof.memory_source})"
    )
    print(proof.verdict_note)


def _weight_and_paging_lines(m: Measurement) -> list[str]:
    """The quantized weights' bytes and the paged optimizer state, when there are any."""
    lines, source = [], memory_source(m.measured)
    if m.quantized_weight_bytes is not None:
        lines.append(
            f"quantized weights {gib(m.quantized_weight_bytes):.3f} GiB "
            f"({source}; within parameters: packed weights + quantization state)"
        )
    if m.paged_bytes is not None:
        lines.append(f"{paging.note(m.paged_bytes, bool(m.pages_to_host))} ({source})")
    return lines


def print_report(r: Report, d: dict[str, Any]) -> None:
    """The text report `analyze` prints and `history show` prints again; `d` is the report's
    `analyze --json` object (`report_to_dict(r)`), which every figure here is read from."""
    print()
    print(r.verdict())
    if r.partial_note:
        print(f"  {r.partial_note}")
    if r.search_note:
        print(f"  {r.search_note}")
    if r.depth_note:
        print(f"  {r.depth_note}")
    if r.rules_note:
        print(f"  note: {r.rules_note}")
    if r.setup_note:
        print(f"  note: {r.setup_note}")
    if r.optimal is None:
        print(f"  usable memory        {d['usable_gb']} GiB, less a {d['margin_gb']} GiB margin")
        _print_evaluation(r)
        _print_compile_gap(r)
        _print_value_reads(r.value_reads)
        _print_plan_and_fixes(r, d["fixes"])
        return
    for line in _weight_and_paging_lines(r.optimal):
        print(f"  {line}")
    reserved = d["optimal_reserved_gb"]
    held = "" if reserved is None else f", {reserved} GiB reserved"
    print(
        f"  optimal batch size   {d['optimal_batch_size']}  ({d['optimal_memory_gb']} GiB"
        f"{held}, {r.memory_source}; keeps the margin free)"
    )
    print(f"  max batch size       {d['max_batch_size']}  ({r.max_note()})")
    oom = d["predicted_oom_batch"]
    print(
        f"  usable memory        {d['usable_gb']} GiB, less a {d['margin_gb']} GiB margin"
        + ("" if oom is None else f"; batch {oom} runs out of memory")
    )
    if not r.current_fits:
        print(f"  current batch size   {d['current_batch_size']}  crashes: out of memory")
    else:
        print(f"  current batch size   {d['current_batch_size']}  ({d['current_memory_gb']} GiB)")
        print(f"  waste                {d['waste_gb']} GiB  ({d['waste_percent']}% of usable)")
        _print_throughput(d)
        print(
            f"  annual savings       ${d['cost_savings_annual']:,.0f}  at ${r.usd_per_hour:.2f}/h,"
            f" {r.costs.hours_per_run:g} h/run, {r.costs.runs_per_year:g} runs/year"
        )
    _print_evaluation(r)
    _print_compile_gap(r)
    print(f"  {d['probes']} probes in {d['elapsed_seconds']:.1f} s")
    if r.loop_note:
        print(f"  {r.loop_note}")
    _print_value_reads(r.value_reads)
    _print_distributed(r, d["distributed"])
    _print_plan_and_fixes(r, d["fixes"])


def _print_compile_gap(r: Report) -> None:
    """With --compile: the same step run eagerly, and what compiling changed at the peak."""
    gap = r.compile_gap
    if gap is None:
        return
    print(f"  {gap.verdict()} ({r.memory_source})")
    if gap.stopped_note:
        print(f"  {gap.stopped_note}")


def _print_evaluation(r: Report) -> None:
    """The evaluation pass between training steps, when the settings ask for one."""
    answer = r.evaluation
    if answer is None:
        return
    print(f"  {answer.verdict()[:-1]} ({r.memory_source})")
    if answer.stopped_by:
        print(f"  the eval batch search stopped at {answer.stopped_by}: the best known so far")
    if answer.note:
        print(f"  note: {answer.note}")


def _print_distributed(r: Report, d: dict[str, Any]) -> None:
    """Per-GPU and global batch, and rank 0's memory, for a run on many GPUs."""
    if d["dist"] == "none":
        _print_pipeline(r, d.get("pipeline"))
        return
    zero = "" if d["zero_stage"] is None else f", ~ZeRO-{d['zero_stage']}"
    print(
        f"  on {plural(d['gpus'], 'GPU')} ({plural(d['nodes'], 'node')}, {d['dist']}{zero}): "
        f"per-GPU batch {d['per_gpu_batch']}, global batch {d['global_batch']}"
    )
    if d["per_rank_breakdown_bytes"]:
        parts = ", ".join(
            f"{name} {gib(n):.2f}" for name, n in d["per_rank_breakdown_bytes"].items()
        )
        print(f"  per rank (GiB, {r.memory_source}): {parts}; NCCL {d['per_rank_nccl_gb']} (est.)")
    _print_pipeline(r, d.get("pipeline"))


def _print_pipeline(r: Report, p: dict[str, Any] | None) -> None:
    """Each distinct pipeline rank's peak, and the worst (the one the verdict is about)."""
    if not p or not p["stages"]:
        return
    print(
        f"  pipeline {p['layout']}, {p['schedule']}: {p['microbatches']} microbatches of "
        f"{p['micro_batch']} per local batch; worst stage on rank {p['worst_rank']} "
        f"(pipeline rank {p['worst_pp_rank']}), {p['worst_peak_gb']} GiB ({r.memory_source})"
    )
    for stage in p["stages"]:
        ranks = stage["stands_for"]
        also = f" (stands for pipeline ranks {ranks[0]}-{ranks[-1]})" if len(ranks) > 1 else ""
        print(
            f"    pipeline rank {stage['pp_rank']} (rank {stage['rank']}, stages "
            f"{', '.join(map(str, stage['stages']))}): peak {stage['memory_gb']:.2f} GiB{also}"
        )


def _print_plan_and_fixes(r: Report, fixes: list[dict[str, Any]]) -> None:
    plan = r.plan
    if plan is not None and plan.target_batch is not None:
        checked = "checked with accumulation" if r.plan_probes else "fits"
        print(f"  for a global batch of {plan.target_batch}: {plan.says()}/step ({checked})")
    elif r.plan_note:
        print(f"  {r.plan_note}")
    if r.fixes:
        _print_fixes(r, fixes)
    if r.ways_out_note:
        print(f"  {r.ways_out_note}")


def way_out_found_line(fix: Fix) -> str:
    """One way out as the search finds it: its title, what batch 1 needs of its limit
    (simulated, or at least the counted states), and whether it fits."""
    need = f"{'>= ' if fix.lower_bound else ''}{gib(fix.required_bytes):.2f}"
    per = " per GPU" if fix.gpus > 1 else ""
    verdict = "fits" if fix.fits else "still too big"
    source = "counted states, a lower bound" if fix.lower_bound else "simulated"
    return (
        f"way out found: {fix.title}: batch 1 needs {need} GiB of "
        f"{gib(fix.limit_bytes):.2f}{per} ({source}), {verdict}"
    )


def _print_fixes(r: Report, fixes: list[dict[str, Any]]) -> None:
    """Each way out: what it needs at batch 1 against its limit, and what a fit costs. `fixes`
    is the `analyze --json` object's list, in the same order as `r.fixes`."""
    needed = r.batch_1_required_bytes
    needs = (
        "Batch 1's need was not simulated in time"
        if needed is None
        else f"Batch 1 needs {gib(needed):.2f} GiB"
    )
    print(
        f"\n{needs} on this {r.gpu.name}; ways out "
        "(simulated at batch 1: what the allocator would reserve, of usable memory less the "
        "margin; >= is a lower bound from the states alone; prices estimated):"
    )
    for fix in fixes:
        verdict = "fits" if fix["fits"] else "still too big"
        per = " per GPU" if fix["gpus"] > 1 else ""
        price = f"  {fix['cost_note']}" if fix["fits"] else ""
        print(
            f"  {fix['title']:<44} {'>=' if fix['at_least'] else '  '}"
            f"{fix['batch_1_required_gb']:9.2f} GiB of {fix['limit_gb']:.2f}{per}  "
            f"{verdict}{price}"
        )


def _print_throughput(d: dict[str, Any]) -> None:
    """Throughput, speedup and where larger batches stop paying off, saying how each was got."""
    if d["speedup_source"] != "throughput":
        print(
            f"  batch ratio          {d['batch_ratio']}x  (optimal / current batch; throughput "
            "not known)"
        )
        return
    source = d["throughput_source"]
    how = "measured" if source == "measured" else "estimated from FLOPs and bytes"
    print(
        f"  throughput           {d['optimal_samples_per_second']} samples/s at batch "
        f"{d['optimal_batch_size']}, {d['current_samples_per_second']} at "
        f"{d['current_batch_size']}  ({how})"
    )
    print(
        f"  speedup              {d['speedup']}x  (throughput ratio, {source}; batch ratio "
        f"{d['batch_ratio']}x)"
    )
    knee = d["diminishing_returns_batch"]
    if knee is not None and knee < d["optimal_batch_size"]:
        print(
            f"  larger batches stop paying off at batch {knee} "
            f"({100 * d['diminishing_returns_fraction']:.0f}% of the best throughput measured)"
        )


def print_calibration_row(row: CalibrationRow) -> None:
    """One calibration row: measured vs simulated allocated and reserved bytes, and verdicts."""

    def pair(measured: int | None, predicted: int | None, error: float | None) -> str:
        real = "OOM" if measured is None else f"{gib(measured):.3f}"
        sim = "n/a" if predicted is None else f"{gib(predicted):.3f}"
        pct = "   n/a" if error is None else f"{100 * error:+6.2f}%"
        return f"{real:>7} vs {sim:>7} GiB {pct}"

    def verdict(runs: bool) -> str:
        return "runs" if runs else "OOM"

    allocated = pair(
        row.measured_allocated_bytes, row.predicted_allocated_bytes, row.allocated_error
    )
    reserved = pair(row.measured_reserved_bytes, row.predicted_reserved_bytes, row.reserved_error)
    check = f"  [{row.boundary_check}]" if row.boundary_check else ""
    print(
        f"{row.model:<10} {row.protocol:<15} {row.precision:<10} batch {row.batch_size:>5}  "
        f"allocated {allocated}  reserved {reserved}  "
        f"{verdict(row.measured_fits)}/{verdict(row.predicted_fits)} "
        f"{'agree' if row.verdict_agrees else 'DISAGREE'}{check}",
        flush=True,
    )
