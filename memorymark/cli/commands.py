"""What each CLI command does once its flags are parsed: call the engine, print the answer.

Human output goes line by line as probes land; --json prints one object at the end and nothing
else. The text itself is `render`'s, which `history show` prints saved runs with too. Loaded only
for a command that runs something, so `--help`, flag errors and `history` answer without torch.
Must not know how a step is measured or searched (every figure comes from the engine's Session),
nor how an answer reads (`render`).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from memorymark import gpus, history
from memorymark.analyses.layouts import check_settings as check_layout_settings
from memorymark.backends.oom import StepError
from memorymark.calibration import record
from memorymark.calibration import run as calibration
from memorymark.calibration.run import NoGpuError
from memorymark.cli import layout_table, render
from memorymark.cli.training_file import load_training
from memorymark.engine import FIXES_STAGE, Session
from memorymark.measurement import Measurement
from memorymark.report import Report, setup_note
from memorymark.reporting import exports
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.snippets import snippet
from memorymark.settings import Costs, Settings
from memorymark.step.user_job import Training

__all__ = ["NoGpuError", "StepError", "run"]


def run(args: argparse.Namespace, settings: Settings | None) -> int:
    """Dispatch one parsed command, with the Settings its flags describe (None for
    `calibrate`); returns the exit status. `models` and `gpus` are memorymark/cli/catalogs.py's."""
    if args.command == "calibrate":
        return _calibrate(args)
    assert settings is not None
    if os.environ.get("RANK", "0") != "0":
        # Under torchrun every rank sweeps in lock-step (memorymark/backends/torchrun.py); rank 0
        # speaks.
        sys.stdout = open(os.devnull, "w")  # kept for the process's life
    training = (
        load_training(args.training, _target_gpu(settings))
        if getattr(args, "training", None)
        else None
    )
    if args.command == "measure":
        with _user_output(training):
            session = Session(settings, training=training)
            m = session.measure(args.batch_size)
        note = setup_note(training.set_up_for if training else None, session.gpu.name)
        if args.json:
            render.print_json({**m.to_dict(), **({"setup_note": note} if note else {})})
        else:
            render.print_measurement(m)
            if note:
                print(f"  note: {note}")
        return 0
    if args.command == "compare":
        return _compare(args, settings)
    if args.command == "layouts":
        check_layout_settings(settings)  # before the Session, which refuses --tp today
        search = Session(settings).layouts(Costs(usd_per_hour=args.price), args.samples_per_run)
        if args.json:
            render.print_json({**search.to_dict(), **layout_table.best_code(search)})
        else:
            layout_table.print_layouts(search, settings)
        return 0
    if args.command == "validate-backward":
        proof = Session(settings, training=training).prove_backward(
            args.batch_size, sweeps=args.sweeps
        )
        if args.json:
            render.print_json(proof.to_dict())
        else:
            render.print_proof(proof)
        return 0
    return _analyze(args, settings, training)


def _target_gpu(settings: Settings) -> gpus.GPU | None:
    """The GPU a training file is set up as on: the one it is sized for, unless it runs on
    this machine's own GPU (which answers for itself)."""
    from memorymark.backends import resolve  # loads torch

    backend = resolve.resolve_backend_name(settings)
    if backend in ("cuda", "mps"):
        return None
    return resolve.resolve_gpu(settings, backend)


def _analyze(args: argparse.Namespace, settings: Settings, training: Training | None) -> int:
    if settings.search.find == "seq-len":
        return _find_seq_len(args, settings)
    fmt = "json" if args.json else (args.format or "text")
    costs = Costs(
        usd_per_hour=args.price, hours_per_run=args.hours_per_run, runs_per_year=args.runs_per_year
    )
    if training is not None and fmt in ("hf", "lightning", "torch"):
        raise ValueError(
            f"--format {fmt} writes settings for a catalog model; a training job's answer is "
            "its report (text, json or markdown)"
        )
    session = Session(settings, training=training)
    session.check_time_limit()  # before the header: a refusal is the only line printed
    talk = fmt == "text"
    if settings.hardware.gpu_count is None:
        session = session.with_min_gpus()
        if talk:
            assert session.gpu_search is not None
            render.print_gpu_search(session.gpu_search)
    if talk:
        s = session.settings
        ranks = "" if s.hardware.gpu_count == 1 else render.ranks_text(s)
        gpu, backend, source = session.gpu, session.backend_name, session.memory_source
        subject = training.label if training is not None else settings.workload.model
        print(render.header_line(subject, gpu, backend, source, ranks))
    for m in _quietly(session.stream(), training):
        if talk:
            print(render.probe_line(m, session.gpu.usable_bytes), flush=True)
    # Under torchrun the ways out would be simulated, which needs a process group of its own.
    # After the last probe the report may run more steps (the plan's accumulation, the eval
    # batch, the ways out): a line says which, so the terminal does not sit silent.
    heard = (lambda text: print(f"  ... {text}", flush=True)) if talk else None
    fixes = "RANK" not in os.environ
    if talk and fixes and session.needs_ways_out:
        _print_ways_out_as_found(session)
    with _user_output(training):
        report = session.report(costs, fixes=fixes, on_stage=heard)
    data = report_to_dict(report)  # once: printed and saved alike
    # Under torchrun every rank has the same report: rank 0 alone saves it, as it alone prints.
    # A training job's code is not in the history, so its run could not be shown again there.
    unsaved = args.no_save or training is not None or os.environ.get("RANK", "0") != "0"
    saved = None if unsaved else _save(report, data)
    if fmt == "json":
        render.print_json(data)
    elif fmt == "text":
        render.print_report(report, data)
        print(f"  {render.environment_line(report)}")
        if saved is not None:
            print(f"  saved as run {saved} (memorymark history show {saved})")
    elif fmt == "markdown":
        print(exports.markdown(report, data), end="")
    else:
        if report.plan is None:
            reason = report.plan_note or report.verdict()
            raise ValueError(f"there are no {fmt} settings to print: {reason}")
        print(snippet(fmt, settings, report.plan), end="")
    return 0


def _print_ways_out_as_found(session: Session) -> None:
    """Nothing fit: each way out on its own line the moment the search finds it (the report
    lists them all again, priced, at the end)."""
    print(f"  ... {FIXES_STAGE}", flush=True)
    limit = session.settings.search.ways_out_time_limit_seconds
    if limit is not None:
        print(f"  ... within {limit:g} s (--ways-out-time-limit)", flush=True)
    for _label, fix in session.ways_out().stages():
        if fix is not None:
            print(f"  ... {render.way_out_found_line(fix)}", flush=True)


def _user_output(training: Training | None) -> contextlib.AbstractContextManager[object]:
    """While a user's step runs, what it prints (its loss, every step) goes to stderr: stdout
    holds the answer alone, so `--json` stays one object."""
    if training is None:
        return contextlib.nullcontext()
    return contextlib.redirect_stdout(sys.stderr)


def _quietly(probes: Iterator[Measurement], training: Training | None) -> Iterator[Measurement]:
    """`probes`, each computed under `_user_output`, printed between them as usual."""
    with contextlib.closing(probes):  # type: ignore[type-var]
        while True:
            with _user_output(training):
                m = next(probes, None)
            if m is None:
                return
            yield m


def _save(report: Report, data: dict[str, Any]) -> int | None:
    """Save a finished run (`data`: its `analyze --json` object) to the history (closed again
    before `main` returns: `__main__` leaves with `os._exit`); a failure to save warns and leaves
    the answer alone."""
    try:
        return history.save(report, source="cli", warn=render.warn, data=data)
    except history.HistoryError as exc:
        render.warn(f"this run was not saved to the history: {exc}")
        return None


def _find_seq_len(args: argparse.Namespace, settings: Settings) -> int:
    if args.format not in (None, "json", "text"):
        raise ValueError(f"--format {args.format} prints batch-size settings: use --find batch")
    session = Session(settings)
    talk = not args.json and args.format != "json"
    if talk:
        subject = f"{settings.workload.model} at batch {settings.search.current_batch}"
        print(render.header_line(subject, session.gpu, session.backend_name, session.memory_source))
    for seq_len, m in session.stream_seq_len():
        if talk:
            print(render.seq_probe_line(seq_len, m, session.gpu.usable_bytes), flush=True)
    answer = session.seq_len_answer()
    if talk:
        print(f"{answer.verdict()}; searched in {answer.elapsed_seconds:.1f} s")
        if answer.search_fallback:
            print(f"  the symbolic search traced every length: {answer.search_fallback}")
    else:
        render.print_json(answer.to_dict())
    return 0


def _compare(args: argparse.Namespace, settings: Settings) -> int:
    session = Session(settings)
    rows, probes = session.compare(Costs(hours_per_run=args.hours_per_run))
    data = [r.to_dict(settings.workload.precision, tf32=settings.workload.tf32) for r in rows]
    if args.json:
        render.print_json(data)
        return 0
    print(f"{'GPU':<12} {'usable GiB':>10} {'max batch':>9} {'TFLOP/s':>8} {'$/hour':>7} "
          f"{'speed':>6} {'hours/run':>9} {'$/run':>8}")  # fmt: skip
    for d in data:
        print(
            f"{d['gpu']:<12} {d['usable_gb']:>10} {d['max_batch'] or 'none':>9} "
            f"{d['peak_tflops']:>8.1f} {d['usd_per_hour']:>7} {d['relative_speed']:>6.2f} "
            f"{d['est_hours_per_run']:>9.2f} {d['est_cost_per_run_usd']:>8.2f}"
        )
    matmuls = (
        "TF32" if settings.workload.tf32 else "plain FP32 (PyTorch's default; --tf32 for TF32)"
    )
    rate = matmuls if settings.workload.precision == "32-true" else "tensor-core 16-bit"
    print(
        f"max batch simulated ({len(probes)} probes); TFLOP/s: {rate}; speed, hours and cost "
        f"estimated against {args.hours_per_run:g} h at batch {settings.search.current_batch} on "
        f"{session.gpu.name}"
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
        print(
            f"skipped {settings.workload.model} ({settings.workload.precision}): {reason}",
            file=sys.stderr,
        )

    rows_found = calibration.calibrate(
        grid, args.batch_sizes, emulate=emulate, on_skip=skipped, steps=args.steps
    )
    for row in rows_found:
        rows.append(row)
        if not args.json:
            render.print_calibration_row(row)
    csv_path, json_path = record.write(rows, Path(args.out))
    if args.json:
        render.print_json([r.to_dict() for r in rows])
    else:
        print(f"wrote {csv_path} and {json_path}")
    return 0
