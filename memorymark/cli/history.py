"""`memorymark history list|show|delete|export`: the saved analyses from the command line.

Owns the history subcommands' flags and output: a table or, with --json, one JSON value and
nothing else. It only reads the database and prints through `render` (`show` prints a saved
report exactly as `analyze` did), so no action imports the engine or torch. Errors are
HistoryError or ValueError with one line; `parser.main` turns them into exit status 2.
Must not know how a run is measured or searched.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memorymark.cli import render
from memorymark.cli.arg_types import positive_whole_number
from memorymark.history import History, RunSummary, SavedRun
from memorymark.history.db_file import DB_ENV
from memorymark.reporting.exports import EXPORT_FORMATS, export_text, file_name
from memorymark.reporting.json_form import report_to_dict
from memorymark.units import gib


def add_parser(sub: Any) -> None:
    """The `history` command and its four actions, under the CLI's subparsers `sub`."""
    history = sub.add_parser(
        "history",
        help=f"list, show, delete or export saved analyses (the database: ${DB_ENV})",
        epilog="example: memorymark history list --model bert --gpu a10",
    )
    actions = history.add_subparsers(dest="action", required=True, parser_class=type(history))
    listing = actions.add_parser(
        "list",
        help="saved runs, newest first",
        epilog="example: memorymark history list --gpu A10 --limit 5",
    )
    listing.add_argument("--model", help="only runs whose model name contains this text")
    listing.add_argument("--gpu", help="only runs on this GPU (a catalog name or alias)")
    listing.add_argument("--limit", type=positive_whole_number, help="at most this many runs")
    show = actions.add_parser(
        "show",
        help="print a saved run's report as analyze does, without re-running it",
        epilog="example: memorymark history show 3",
    )
    show.add_argument("id", type=positive_whole_number, help="the run's id (see `history list`)")
    delete = actions.add_parser(
        "delete", help="delete saved runs", epilog="example: memorymark history delete 3 4"
    )
    delete.add_argument("ids", nargs="+", type=positive_whole_number, metavar="ID")
    export = actions.add_parser(
        "export",
        help="a saved run as JSON, a CSV of its probes, or a Markdown page for an issue",
        epilog="example: memorymark history export 3 --format markdown --out reports/",
    )
    export.add_argument("id", type=positive_whole_number)
    export.add_argument("--format", choices=tuple(EXPORT_FORMATS), default="json")
    export.add_argument(
        "--out",
        metavar="PATH",
        help="write to this file, or into this folder under a name with the model, GPU, key "
        "settings and time (default: print it)",
    )
    for action in (listing, show, delete, export):
        action.add_argument("--json", action="store_true", help="print JSON and nothing else")


def run(args: argparse.Namespace) -> int:
    """Run one history action; returns the exit status (errors raise, one line)."""
    with History(warn=render.warn) as history:
        return _ACTIONS[args.action](history, args)


def _list(history: History, args: argparse.Namespace) -> int:
    runs = history.runs(model=args.model, gpu=args.gpu, limit=args.limit)
    if args.json:
        render.print_json([r.to_dict() for r in runs])
        return 0
    if not runs:
        print(f"no saved runs in {history.path}")
        return 0
    print(f"{'ID':>4}  {'finished (UTC)':<20} {'model':<18} {'GPU':<12} {'optimal':>7} "
          f"{'max':>5} {'memory GiB':>10}  source")  # fmt: skip
    for r in runs:
        print(_list_line(r))
    return 0


def _list_line(r: RunSummary) -> str:
    optimal = "none" if r.optimal_batch is None else str(r.optimal_batch)
    most = "none" if r.max_batch is None else str(r.max_batch)
    memory = "" if r.optimal_peak_bytes is None else f"{gib(r.optimal_peak_bytes):.3f}"
    return (
        f"{r.id:>4}  {r.created_utc:<20} {r.model[:18]:<18} {r.gpu[:12]:<12} {optimal:>7} "
        f"{most:>5} {memory:>10}  {r.memory_source}, {r.source}"
    )


def _show(history: History, args: argparse.Namespace) -> int:
    run = history.get(args.id)
    if args.json:
        render.print_json(run.to_dict())
        return 0
    try:
        report, note = run.reopen()
    except ValueError as exc:
        raise ValueError(f"run {run.id}: {exc} (`history show {run.id} --json` prints what was "
                         "saved)") from None  # fmt: skip
    print(f"run {run.id}, saved by {run.summary.source}: {render.environment_line(report)}")
    print(f"$ {run.summary.command_line}")
    if note:
        print(f"note: {note}")
    gpu = report.gpu
    print(
        render.header_line(
            report.settings.workload.model, gpu, report.backend, report.memory_source
        )
    )
    for m in report.measurements:
        print(render.probe_line(m, gpu.usable_bytes))
    render.print_report(report, report_to_dict(report))
    return 0


def _delete(history: History, args: argparse.Namespace) -> int:
    for run_id in args.ids:  # all or nothing: an unknown id deletes none of them
        history.get(run_id)
    deleted = history.delete(args.ids)
    if args.json:
        render.print_json({"deleted": deleted})
    else:
        print(f"deleted {len(deleted)} run{'s' if len(deleted) != 1 else ''}: "
              f"{', '.join(map(str, deleted))}")  # fmt: skip
    return 0


def _export(history: History, args: argparse.Namespace) -> int:
    run = history.get(args.id)
    if args.json and args.format != "json" and not args.out:
        raise ValueError(f"--json prints JSON: give --out PATH to write {args.format} to a file")
    text = _export_text(run, args.format)
    if not args.out:
        print(text, end="")
        return 0
    path = _out_path(Path(args.out), run, args.format)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ValueError(f"cannot write {path}: {exc.strerror}") from None
    if args.json:
        render.print_json({"id": run.id, "format": args.format, "path": str(path)})
    else:
        print(f"wrote {path}")
    return 0


def _export_text(run: SavedRun, fmt: str) -> str:
    if fmt == "json":  # exactly what was saved, stamp included
        data = dict(run.report_json)
        data.setdefault("environment", run.environment)
        return json.dumps(data, indent=2) + "\n"
    return export_text(run.report(), fmt)


def _out_path(out: Path, run: SavedRun, fmt: str) -> Path:
    if out.is_dir():
        return out / file_name(run.report(), fmt)
    if not out.parent.is_dir():
        raise ValueError(f"no folder {out.parent} to write {out.name} into")
    return out


_ACTIONS: dict[str, Callable[[History, argparse.Namespace], int]] = {
    "list": _list,
    "show": _show,
    "delete": _delete,
    "export": _export,
}
