"""The README tables the evidence files feed, regenerated in place (`calibration_table.py --write`).

`write_readmes` puts calibration_table's `--summary` table where the README, the accuracy page
and docs/calibration's README show it, and rewrites docs/calibration's evidence section (between
`EVIDENCE_BEGIN` and `EVIDENCE_END`) from the evidence run's own files: the capped-capacity rows
under both caps side by side, the loops (`loops-*.jsonl`), the peers (`peers-*.csv`) and the
runs' manifests (`evidence-*.json`). Reads files only: no torch.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
HEADER = (
    "| GPU | rows | allocated error, median / worst | reserved error, median / worst "
    "| verdicts agree |"
)
EVIDENCE_BEGIN = "<!-- evidence:begin (calibration_table.py --write) -->"
EVIDENCE_END = "<!-- evidence:end -->"
NONE_YET = (
    "No evidence run committed yet: a session lent a GPU runs `make gpu-evidence` "
    "([development](../development.md#the-evidence-run))."
)


def write_readmes(folder: Path, summary: str, root: Path = ROOT) -> list[Path]:
    """Rewrite each README's summary table (and, in docs/calibration/README.md, the list of
    disagreements under it and the evidence section); returns the files changed."""
    calibration = root / "docs" / "calibration" / "README.md"
    changed = []
    for path in (root / "README.md", root / "docs" / "accuracy.md", calibration):
        text = path.read_text()
        new = replace_table(text, summary, with_disagreements=path == calibration)
        if path == calibration:
            new = replace_between(new, EVIDENCE_BEGIN, EVIDENCE_END, evidence_section(folder))
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


def replace_table(text: str, summary: str, *, with_disagreements: bool) -> str:
    """`text` with its first summary table (and the "Verdicts that disagree" list right after
    it, when asked) replaced by `summary`'s."""
    lines = text.split("\n")
    new = summary.split("\n")
    table = [line for line in new if line.startswith("|")]
    start = lines.index(HEADER)
    end = start
    while end < len(lines) and lines[end].startswith("|"):
        end += 1
    after = end
    if with_disagreements and after + 1 < len(lines) and lines[after + 1].startswith("Verdicts"):
        after += 2
        while after < len(lines) and lines[after].startswith("- "):
            after += 1
        table = new
    return "\n".join([*lines[:start], *table, *lines[after:]])


def replace_between(text: str, begin: str, end: str, body: str) -> str:
    """`text` with what lies between the `begin` and `end` lines replaced by `body`."""
    head, _, rest = text.partition(begin + "\n")
    _, _, tail = rest.partition(end)
    return f"{head}{begin}\n{body}\n{end}{tail}"


def evidence_section(folder: Path) -> str:
    """The capped-capacity answer, the loops, the peers and the runs, from `folder`'s files."""
    parts = [
        capped_table(folder),
        loops_table(_jsonl(folder.glob("loops-*.jsonl"))),
        peers_table(_csv(folder.glob("peers-*.csv"))),
        runs_list(folder.glob("evidence-*.json")),
    ]
    found = [p for p in parts if p]
    return "\n\n".join(found) if found else NONE_YET


def capped_table(folder: Path) -> str:
    """Each re-run row under the memory fraction beside the same row under the ballast."""
    rows = _csv(folder.glob("*-capped-*.csv"))
    if not rows:
        return ""
    pairs: dict[tuple[str, ...], dict[str, dict[str, str]]] = {}
    for r in rows:
        key = (r["emulated_gpu"], r["model"], r["precision"], r["batch_size"])
        pairs.setdefault(key, {})[r["cap_method"]] = r
    lines = [
        "**The capped-capacity question**: rows that needed an allocation retry on a capped "
        "H100, re-run capped by the memory fraction and by a raw `cudaMalloc` ballast "
        "(`cudaMemGetInfo` sees the smaller card). Retries per step [verdict].",
        "",
        "| capacity | model | precision | batch | fraction | ballast | predicted |",
        "| --- | --- | --- | ---: | --- | --- | --- |",
    ]
    for (gpu, model, precision, batch), by in pairs.items():
        any_row = next(iter(by.values()))
        cells = [_retries(by.get(cap), "measured") for cap in ("fraction", "ballast")]
        predicted = _retries(any_row, "predicted")
        lines.append(
            f"| {gpu} | {model} | {precision} | {batch} | {' | '.join(cells)} | {predicted} |"
        )
    return "\n".join(lines)


def _retries(row: dict[str, str] | None, side: str) -> str:
    if row is None:
        return "not run"
    runs = row[f"{side}_fits"] == "true"
    return f"{row[f'{side}_retries_per_step'] or '-'} [{'runs' if runs else 'OOM'}]"


def loops_table(lines: list[dict[str, Any]]) -> str:
    """One line per loop: its batch, steps run, evaluations, OOM, retries, reserved peaks."""
    heads = [line for line in lines if line.get("kind") == "loop"]
    errors = [
        f"- {e['model']} on {e['emulated_gpu']} failed: {e['error']}"
        for e in lines
        if e.get("kind") == "error"
    ]
    if not heads:
        return "\n".join(errors)
    out = [
        "**Loops** with evaluation at the recommended batch (`loops-*.jsonl`): reserved GiB, "
        "peak over the loop, measured / predicted.",
        "",
        "| GPU | capacity | model | batch | steps run | evaluations | OOM | retries "
        "| reserved GiB |",
        "| --- | --- | --- | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for head in heads:
        key = (head["model"], head["emulated_gpu"], head["batch_size"], head["gpu_name"])
        steps = [
            line
            for line in lines
            if line.get("kind") in ("train", "eval")
            and (line["model"], line["emulated_gpu"], line["batch_size"], head["gpu_name"]) == key
        ]
        train = [s for s in steps if s["kind"] == "train" and not s["oom"]]
        oom = next((f"step {s['step']} ({s['kind']})" for s in steps if s["oom"]), "none")
        measured = max((s["measured_reserved_bytes"] for s in steps), default=0)
        predicted = max((s.get("predicted_reserved_bytes") or 0 for s in steps), default=0)
        out.append(
            f"| {head['gpu_name']} | {head['emulated_gpu']} | {head['model']} "
            f"| {head['batch_size']} | {len(train)} of {head['loop_steps']} "
            f"| {sum(s['kind'] == 'eval' for s in steps)} | {oom} "
            f"| {sum(s['measured_retries'] for s in steps)} "
            f"| {measured / 2**30:.2f} / {predicted / 2**30:.2f} |"
        )
    return "\n".join([*out, *([""] if errors else []), *errors])


def peers_table(rows: list[dict[str, str]]) -> str:
    """Each finder's answer beside MemoryMark's, and whether it survived the loop."""
    if not rows:
        return ""
    out = [
        "**Peers** on a user-written model (`peers-*.csv`): each answer, the trials and seconds "
        "it took, and the loop at that batch.",
        "",
        "| GPU | capacity | tool | batch | trials | seconds | survived the loop |",
        "| --- | --- | --- | ---: | ---: | ---: | --- |",
    ]
    for r in rows:
        survived = "yes" if r["survived"] == "true" else f"no (OOM at step {r['oom_step']})"
        survived = survived if r["answer_batch"] != "0" else "n/a"
        out.append(
            f"| {r['gpu_name']} | {r['emulated_gpu']} | {r['tool']} | {r['answer_batch']} "
            f"| {r['trials']} | {r['seconds']} | {survived} |"
        )
    return "\n".join(out)


def runs_list(paths: Iterable[Path]) -> str:
    """Each run's chunks: ran in how many seconds, or skipped and why."""
    lines = []
    for path in sorted(paths):
        manifest = json.loads(path.read_text())
        chunks = "; ".join(
            f"{name} {c['status']}"
            + (f" ({c['seconds']} s)" if "seconds" in c else "")
            + (f": {c['why']}" if "why" in c else "")
            for name, c in manifest["chunks"].items()
        )
        lines.append(f"- `{path.name}`: {chunks}.")
    return "**Runs**:\n\n" + "\n".join(lines) if lines else ""


def _jsonl(paths: Iterable[Path]) -> list[dict[str, Any]]:
    return [json.loads(line) for p in sorted(paths) for line in p.read_text().splitlines() if line]


def _csv(paths: Iterable[Path]) -> list[dict[str, str]]:
    rows: list[dict[str, str]] = []
    for path in sorted(paths):
        with path.open(newline="") as f:
            rows.extend(csv.DictReader(f))
    return rows
