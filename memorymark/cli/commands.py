"""What each CLI command does once its flags are parsed: call the engine, print the answer.

Human output goes line by line as probes land; --json prints one object at the end and nothing
else. Split from `cli.py` so that `--help` and flag errors answer without importing torch.
Must not know how a step is measured or searched: every figure comes from the engine's
Session.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from memorymark import gpus, history, models
from memorymark.backends.oom import StepError
from memorymark.calibration import record
from memorymark.calibration import run as calibration
from memorymark.calibration.run import NoGpuError
from memorymark.engine import Session
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.reporting import exports
from memorymark.reporting.snippets import snippet
from memorymark.settings import Costs, Settings
from memorymark.step import paging
from memorymark.units import gib, memory_source

__all__ = ["NoGpuError", "StepError", "run"]


def run(args: argparse.Namespace, settings: Settings | None) -> int:
    """Dispatch one parsed command, with the Settings its flags describe (None for the catalog
    and calibration commands); returns the exit status."""
    if args.command == "models":
        return _models(args)
    if args.command == "gpus":
        return _gpus(args)
    if args.command == "calibrate":
        return _calibrate(args)
    assert settings is not None
    if os.environ.get("RANK", "0") != "0":
        # Under torchrun every rank sweeps in lock-step (memorymark/backends/torchrun.py); rank 0
        # speaks.
        sys.stdout = open(os.devnull, "w")  # kept for the process's life
    if args.command == "measure":
        m = Session(settings).measure(args.batch_size)
        if args.json:
            print_json(m.to_dict())
        else:
            _print_measurement(m)
        return 0
    if args.command == "validate-backward":
        proof = Session(settings).prove_backward(args.batch_size, sweeps=args.sweeps)
        if args.json:
            print_json(proof.to_dict())
        else:
            for r in proof.results:
                extra = "" if r.max_batch is None else f"   max batch {r.max_batch}"
                print(f"{r.label:<42} {gib(r.peak_bytes):8.3f} GiB{extra}")
            print(
                f"forward+backward / forward-only = {proof.ratio:.2f}x  {proof.verdict}"
                f"  (PASS is 2.0-3.0x; memory {proof.memory_source})"
            )
        return 0
    return _analyze(args, settings)


def _analyze(args: argparse.Namespace, settings: Settings) -> int:
    if settings.find == "seq-len":
        return _find_seq_len(args, settings)
    fmt = "json" if args.json else (args.format or "text")
    costs = Costs(
        usd_per_hour=args.price, hours_per_run=args.hours_per_run, runs_per_year=args.runs_per_year
    )
    session = Session(settings)
    session.check_time_limit()  # before the header: a refusal is the only line printed
    talk = fmt == "text"
    if settings.gpu_count is None:
        session = session.with_min_gpus()
        if talk:
            _print_gpu_search(session)
    if talk:
        many = "" if session.settings.dist == "none" else _ranks_text(session.settings)
        print(
            f"{settings.model} on {session.gpu.name}{many} ({session.backend_name}, "
            f"{session.memory_source}): usable "
            f"{session.gpu.usable_gib:.2f} of {session.gpu.total_gib:.2f} GiB"
            + (" per rank" if many else "")
        )
    for m in session.stream():
        if talk:
            _print_probe(m, session.gpu.usable_bytes)
    # Under torchrun the ways out would be simulated, which needs a process group of its own.
    report = session.report(costs, fixes="RANK" not in os.environ)
    # Under torchrun every rank has the same report: rank 0 alone saves it, as it alone prints.
    saved = None if args.no_save or os.environ.get("RANK", "0") != "0" else _save(report)
    if fmt == "json":
        print_json(report.to_dict())
    elif fmt == "text":
        _print_report(report)
        print(f"  {environment_line(report)}")
        if saved is not None:
            print(f"  saved as run {saved} (memorymark history show {saved})")
    elif fmt == "markdown":
        print(exports.markdown(report), end="")
    else:
        if report.plan is None:
            reason = report.plan_note or report.verdict()
            raise ValueError(f"there are no {fmt} settings to print: {reason}")
        print(snippet(fmt, settings, report.plan), end="")
    return 0


def environment_line(report: Report) -> str:
    """The environment stamp in one line: versions, where it ran, and when it finished."""
    env = exports.environment(report)
    return (
        f"MemoryMark {env['memorymark_version']}, torch {env['torch_version']}, transformers "
        f"{env['transformers_version']}, Python {env['python_version']}; finished "
        f"{env['finished_utc']}"
    )


def _save(report: Report) -> int | None:
    """Save a finished run to the history (closed again before `main` returns: `__main__`
    leaves with `os._exit`); a failure to save warns and leaves the answer alone."""
    try:
        return history.save(report, source="cli", warn=_warn)
    except history.HistoryError as exc:
        _warn(f"this run was not saved to the history: {exc}")
        return None


def _warn(message: str) -> None:
    print(f"memorymark: warning: {message}", file=sys.stderr)


def _find_seq_len(args: argparse.Namespace, settings: Settings) -> int:
    if args.format not in (None, "json", "text"):
        raise ValueError(f"--format {args.format} prints batch-size settings: use --find batch")
    session = Session(settings)
    talk = not args.json and args.format != "json"
    if talk:
        print(
            f"{settings.model} at batch {settings.current_batch} on {session.gpu.name} "
            f"({session.backend_name}, {session.memory_source}): usable "
            f"{session.gpu.usable_gib:.2f} of {session.gpu.total_gib:.2f} GiB"
        )
    for seq_len, m in session.stream_seq_len():
        if talk:
            line = probe_line(m, session.gpu.usable_bytes)
            print(line.replace(f"batch {m.batch_size:>6}", f"seq {seq_len:>7}", 1), flush=True)
    answer = session.seq_len_answer()
    if talk:
        print(f"{answer.verdict()}; searched in {answer.elapsed_seconds:.1f} s")
    else:
        print_json(answer.to_dict())
    return 0


def _ranks_text(s: Settings) -> str:
    return f" x{s.gpu_count} ({s.node_count} node(s), {s.dist})"


def _print_gpu_search(session: Session) -> None:
    search = session.gpu_search
    assert search is not None
    for n, m in search.tried:
        need = "" if m.required_bytes is None else f", needs {gib(m.required_bytes):.1f} GiB"
        print(f"  {n:>5} GPUs: batch 1 {'runs' if m.runs else 'does not run'}{need}")
    if search.min_gpus is None:
        print(f"  no count up to {max(n for n, _ in search.tried)} GPUs trains batch 1")
    else:
        print(f"  min_gpus = {search.min_gpus} (simulated, batch 1 trains)")


def _print_probe(m: Measurement, usable_bytes: int) -> None:
    print(probe_line(m, usable_bytes), flush=True)


def probe_line(m: Measurement, usable_bytes: int) -> str:
    """One line per probe: the verdict, peak and reserved bytes, and what an OOM would need."""
    status = "fits" if m.fits else ("runs" if m.runs else "OOM ")
    reserved = m.cuda_reserved_bytes
    held = "" if reserved is None or not m.runs else f"  reserved {gib(reserved):8.3f} GiB"
    rate = ""
    if m.samples_per_second is not None:
        rate = f"  {m.samples_per_second:9.1f} samples/s ({m.throughput_source})"
    if not m.runs:
        if m.required_bytes is None:
            need = "  (the device ran out of memory)"
        else:
            need = f"  needs {gib(m.required_bytes):.1f} GiB of {gib(usable_bytes):.1f}"
        return f"  batch {m.batch_size:>6}  {status}{need}"
    share = 100 * (m.required_bytes or m.peak_bytes) / usable_bytes
    why = f"  ({m.held_back})" if m.held_back else ""
    return (
        f"  batch {m.batch_size:>6}  {status}  peak {gib(m.peak_bytes):8.3f} GiB{held}  "
        f"({share:5.1f}%){rate}{why}"
    )


def _print_measurement(m: Measurement) -> None:
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
    if m.error:
        print(f"  {m.error}")


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


def _print_report(r: Report) -> None:
    d = r.to_dict()
    print()
    print(r.verdict())
    if r.partial_note:
        print(f"  {r.partial_note}")
    if r.rules_note:
        print(f"  note: {r.rules_note}")
    if r.optimal is None:
        print(f"  usable memory        {d['usable_gb']} GiB, less a {d['margin_gb']} GiB margin")
        _print_plan_and_fixes(r)
        return
    for line in _weight_and_paging_lines(r.optimal):
        print(f"  {line}")
    reserved = d["optimal_reserved_gb"]
    held = "" if reserved is None else f", {reserved} GiB reserved"
    print(
        f"  optimal batch size   {d['optimal_batch_size']}  ({d['optimal_memory_gb']} GiB"
        f"{held}, {r.memory_source}; keeps the margin free)"
    )
    print(
        f"  max batch size       {d['max_batch_size']}  (runs with no headroom: "
        f"{d['max_reserved_gb']} GiB reserved)"
    )
    oom = d["predicted_oom_batch"]
    print(
        f"  usable memory        {d['usable_gb']} GiB, less a {d['margin_gb']} GiB margin"
        + ("" if oom is None else f"; batch {oom} runs out of memory")
    )
    if not r.current_fits:
        print(f"  current batch size   {d['current_batch_size']}  crashes: out of memory")
        print(f"  {d['probes']} probes in {d['elapsed_seconds']:.1f} s")
        _print_distributed(r)
        _print_plan_and_fixes(r)
        return
    print(f"  current batch size   {d['current_batch_size']}  ({d['current_memory_gb']} GiB)")
    print(f"  waste                {d['waste_gb']} GiB  ({d['waste_percent']}% of usable)")
    _print_throughput(d)
    print(
        f"  annual savings       ${d['cost_savings_annual']:,.0f}  at ${r.usd_per_hour:.2f}/h, "
        f"{r.costs.hours_per_run:g} h/run, {r.costs.runs_per_year:g} runs/year"
    )
    print(f"  {d['probes']} probes in {d['elapsed_seconds']:.1f} s")
    _print_distributed(r)
    _print_plan_and_fixes(r)


print_report = _print_report
"""The text report `analyze` prints (`history show` prints a saved one with it)."""


def _print_distributed(r: Report) -> None:
    """Per-GPU and global batch, and rank 0's memory, for a run on many GPUs."""
    d = r.to_dict()["distributed"]
    if d["dist"] == "none":
        return
    zero = "" if d["zero_stage"] is None else f", ~ZeRO-{d['zero_stage']}"
    print(
        f"  on {d['gpus']} GPUs ({d['nodes']} node(s), {d['dist']}{zero}): per-GPU batch "
        f"{d['per_gpu_batch']}, global batch {d['global_batch']}"
    )
    if d["per_rank_breakdown_bytes"]:
        parts = ", ".join(
            f"{name} {gib(n):.2f}" for name, n in d["per_rank_breakdown_bytes"].items()
        )
        print(f"  per rank (GiB, {r.memory_source}): {parts}; NCCL {d['per_rank_nccl_gb']} (est.)")


def _print_plan_and_fixes(r: Report) -> None:
    plan = r.plan
    if plan is not None and plan.target_batch is not None:
        checked = "checked with accumulation" if r.plan_probes else "fits"
        print(
            f"  for a global batch of {plan.target_batch}: micro-batch {plan.micro_batch} x "
            f"{plan.accumulation_steps} accumulation steps = {plan.effective_batch} samples/step"
            f" ({checked})"
        )
    elif r.plan_note:
        print(f"  {r.plan_note}")
    if r.fixes:
        needed = r.batch_1_required_bytes
        print(
            f"\nBatch 1 needs {gib(needed or 0):.2f} GiB here; what would make it fit "
            f"({r.memory_source}, batch 1, what the allocator would reserve):"
        )
        for fix in r.fixes:
            verdict = "fits" if fix.fits else "still too big"
            print(
                f"  {fix.label:<34} {'>=' if fix.lower_bound else '  '}"
                f"{gib(fix.required_bytes):9.2f} GiB of "
                f"{gib(fix.capacity_bytes):.2f} on {fix.gpu.name}  {verdict}"
            )


def _print_throughput(d: dict) -> None:
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


def _models(args: argparse.Namespace) -> int:
    rows = [
        {
            "key": e.key,
            "name": e.display_name,
            "default_task": e.default_task,
            "tasks": list(e.tasks),
            "parameters": models.parameter_count(e),
            "max_positions": e.max_positions,
        }
        for e in models.CATALOG
    ]
    if args.json:
        print_json(rows)
        return 0
    for row in rows:
        print(
            f"{row['key']:<14} {row['name']:<34} {row['parameters'] / 1e6:9.1f}M  "
            f"{row['default_task']}"
        )
    return 0


def _gpus(args: argparse.Namespace) -> int:
    rows = gpu_table()
    if args.json:
        print_json(rows)
        return 0
    print(
        f"{'GPU':<12} {'total GiB':>9} {'usable GiB':>10} {'$/hour':>7} {'bf16 TFLOP/s':>12} "
        f"{'fp32 TFLOP/s':>12} {'GB/s':>6}"
    )
    for row in rows:
        print(
            f"{row['name']:<12} {row['total_gb']:>9} {row['usable_gb']:>10} "
            f"{row['usd_per_hour']:>7} {row['bf16_tflops']:>12} {row['fp32_tflops']:>12} "
            f"{row['bandwidth_gb_per_s']:>6}"
        )
    return 0


def _calibrate(args: argparse.Namespace) -> int:
    # Bad input is reported before the GPU is looked for: it is wrong on any machine.
    grid = calibration.settings_grid(
        args.models,
        precisions=args.precisions,
        optimizers=args.optimizers,
        grad_checkpointing=[v == "on" for v in args.grad_checkpointing or ["on"]],
        protocols=args.protocols,
        seq_len=args.seq_len,
        image_size=args.image_size,
        lora_rank=args.lora_rank,
        step=args.step,
    )
    emulate = gpus.find_gpu(args.emulate_gpu) if args.emulate_gpu else None
    rows = []

    def skipped(settings: Settings, reason: str) -> None:
        print(f"skipped {settings.model} ({settings.precision}): {reason}", file=sys.stderr)

    for row in calibration.calibrate(grid, args.batch_sizes, emulate=emulate, on_skip=skipped):
        rows.append(row)
        if not args.json:
            _print_calibration_row(row)
    csv_path, json_path = record.write(rows, Path(args.out))
    if args.json:
        print_json([r.to_dict() for r in rows])
    else:
        print(f"wrote {csv_path} and {json_path}")
    return 0


def _print_calibration_row(row: record.CalibrationRow) -> None:
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


def print_json(data: Any) -> None:
    """One JSON object on stdout."""
    print(json.dumps(data, indent=2))


def gpu_table() -> list[dict[str, Any]]:
    """The GPU catalog as rows (for `gpus`)."""
    return [
        {
            "name": g.name,
            "total_gb": round(g.total_gib, 2),
            "usable_gb": round(g.usable_gib, 2),
            "usd_per_hour": g.usd_per_hour,
            "bf16_tflops": g.bf16_tflops,
            "fp32_tflops": g.fp32_tflops,
            "bandwidth_gb_per_s": round(g.memory_bandwidth_bytes_per_s / 1e9),
            # One direction, per GPU: NVLink or PCIe inside a node, the network between nodes.
            "intra_node_gb_per_s": round(g.intra_node_bytes_per_s / 1e9, 2),
            "inter_node_gb_per_s": round(g.inter_node_bytes_per_s / 1e9, 2),
            "aliases": g.aliases,
        }
        for g in gpus.CATALOG
    ]
