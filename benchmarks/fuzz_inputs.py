"""Throw hostile inputs at every way in, and count the answers that are not one clean line.

    PYTHONPATH=. python benchmarks/fuzz_inputs.py [--cases 300] [--seed 0]

Entry points: URL query parameters (`Settings.from_query`, `Costs.from_query`), the command line
(`memorymark.cli.parser.main`, with the engine stubbed so a case costs parsing and validation; a few
tiny real runs too), config.json contents (`file:` specs, and every accepted one built on the
meta device), paths that are not regular files, and model specs (`hf:`, `timm:`,
`torchvision:`, `file:`, catalog names). A failure is an exception other than ValueError (a
traceback), a message of more than one line, a CLI exit status other than 0, 1 or 2 or a
stderr of more than one line, or a case over its time bound (a hang). No network: the hub is
stubbed offline. Prints the cases tried and the failures; it should print 0 failures.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import random
import resource
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import huggingface_hub

from memorymark import models
from memorymark.cli import commands
from memorymark.cli import parser as cli
from memorymark.models import catalog, sources
from memorymark.settings import COST_NAMES, FIELD_NAMES, Costs, Settings

CASE_SECONDS = 20  # per case; the slowest accepted config build takes a few seconds
HOSTILE = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "1e308", "1e9", "1e-400",
           "0", "-0", "-1", "1", "1.5", "0x10", "1_000", " 7 ", "", " ", "None", "null", "true",
           "9" * 5000, "-" + "9" * 400, "2%", "49.99%", "50%", "1e400GiB", "nanGiB", "-1GiB",
           "512MiB", "1GiB", "3000GiB", "\x00", "\n1", "1\n", "%", "GiB", "\u0661", "\u00b2",
           "[x](//evil.example)", "<script>", "../../etc/passwd", "😀" * 50]  # fmt: skip
SPECS = ["hf:org/name", "hf:gpt2", "hf:../../etc", "hf:org/name/x", "hf:a--b/c", "hf:org/..",
         "timm:local-dir:/etc", "timm:hf-hub:org/model", "timm:convnext_tiny", "timm:a.b.c",
         "timm:/etc", "torchvision:resnet50", "torchvision:../x", "file:/dev/zero", "file:/",
         "file:", "hf:", ":", "::", "nonsense:x", "bert", "BERT ", "tiny-bert", "x" * 100_000,
         "[Sign in again](//evil.example/login)", "file:/etc/passwd", "file:\x00",
         "file:~/config.json", "hf:org/name\n", "timm:resnet50\x00"]  # fmt: skip


@dataclass
class Family:
    """What one entry point answered."""

    name: str
    tried: int = 0
    refused: int = 0
    failures: list[str] = field(default_factory=list)
    slowest_seconds: float = 0.0


class Hang(BaseException):  # not an Exception: no `except Exception` on the way may swallow it
    """A case ran past CASE_SECONDS."""


def _alarm(signum: int, frame: object) -> None:
    raise Hang(f"over {CASE_SECONDS} s")


def one_line(message: str) -> bool:
    return bool(message) and "\n" not in message and len(message) < 400


def run_case(family: Family, label: str, case: Callable[[], str | None]) -> None:
    """Run one case: it returns None (accepted) or a refusal message, or raises ValueError."""
    family.tried += 1
    started = time.perf_counter()
    signal.alarm(CASE_SECONDS)
    try:
        refusal = case()
    except ValueError as exc:
        refusal = str(exc)
    except BaseException as exc:  # noqa: BLE001 - anything else is what this script counts
        family.failures.append(f"{label}: {type(exc).__name__}: {str(exc)[:120]!r}")
        return
    finally:
        signal.alarm(0)
        seconds = time.perf_counter() - started
        family.slowest_seconds = max(family.slowest_seconds, seconds)
    if seconds > CASE_SECONDS:
        family.failures.append(f"{label}: took {seconds:.1f} s")
        return
    if refusal is not None:
        family.refused += 1
        if not one_line(refusal):
            family.failures.append(f"{label}: not one line: {refusal[:200]!r}")


def hostile(rng: random.Random) -> str:
    pick = rng.random()
    if pick < 0.3:
        return rng.choice(["1", "8", "16", "32", "128", "2%", "1.0"])  # valid for most fields
    if pick < 0.6:
        return rng.choice(HOSTILE)
    if pick < 0.8:
        return str(rng.choice([-1, 1]) * 10 ** rng.randint(0, 30))
    return "".join(chr(rng.randint(0, 0x2FF)) for _ in range(rng.randint(0, 12)))


def query_cases(rng: random.Random, n: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    for cls in (Settings, Costs):
        names = list(FIELD_NAMES if cls is Settings else COST_NAMES)
        for _ in range(n):
            params = {rng.choice(names): hostile(rng) for _ in range(rng.randint(1, 4))}
            if cls is Settings and rng.random() < 0.3:
                params["model"] = rng.choice(SPECS)
            yield f"{cls.__name__}.from_query({params!r:.80})", _accepts(cls.from_query, params)


def _accepts(fn: Callable[..., object], *args: object) -> Callable[[], None]:
    def case() -> None:
        fn(*args)

    return case


NUMERIC_FLAGS = ["--seq-len", "--image-size", "--lora-rank", "--gpu-memory", "--max-grad-norm",
                 "--grad-accum", "--step", "--current-batch", "--max-batch", "--target-batch",
                 "--margin", "--price", "--hours-per-run", "--runs-per-year"]  # fmt: skip


def cli_case(argv: list[str]) -> Callable[[], str | None]:
    def case() -> str | None:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            try:
                status = cli.main(argv)
            except SystemExit as done:
                status = done.code
        text = err.getvalue()
        if status not in (0, 1, 2):
            raise RuntimeError(f"exit status {status}")
        if status and len(text.splitlines()) != 1:
            raise RuntimeError(f"stderr of {len(text.splitlines())} lines: {text[:200]!r}")
        return text.strip() if status == 2 else None

    return case


def cli_cases(rng: random.Random, n: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    for _ in range(n):
        command = rng.choice(["analyze", "measure", "validate-backward"])
        flags = rng.sample(NUMERIC_FLAGS[:6] if command != "analyze" else NUMERIC_FLAGS, 3)
        argv = [command, rng.choice(SPECS[:12] + ["tiny-bert"] * 8)]
        argv += [f"{flag}={hostile(rng)}" for flag in flags]
        if command != "analyze":
            argv.append(f"--batch-size={rng.choice(['1', '0', '1e9', '8', str(2**40), 'x'])}")
        yield f"cli {argv!r:.100}", cli_case(argv)


def real_cli_cases(rng: random.Random, n: int) -> Iterator[tuple[str, Callable[[], str | None]]]:
    """Tiny real runs: the engine itself, on values near and past what validation accepts."""
    for i in range(n):
        pick = rng.choice
        argv = ["measure", "tiny-bert", f"--batch-size={pick([1, 2, 3])}",
                f"--max-grad-norm={pick(['1', '1e-30', '1e300', 'nan'])}",
                f"--grad-accum={pick(['1', '2', '64', '65'])}"]  # fmt: skip
        if i % 2:
            argv = ["analyze", "tiny-bert", "--max-batch=16", f"--margin={pick(MARGINS)}",
                    f"--price={pick(['0', '1000', '1e9', 'inf'])}",
                    f"--hours-per-run={pick(['0', '8784', '1e308'])}"]  # fmt: skip
        argv += [f"--seq-len={pick([1, 8, 128, 129, 10**6])}", "--json"]
        yield f"real cli {argv!r:.100}", cli_case(argv)


MARGINS = ["0%", "49%", "2048GiB", "1e400GiB", "1MiB"]


def random_json(rng: random.Random, depth: int = 0) -> object:
    kind = rng.randint(0, 9 if depth < 3 else 5)
    simple = [None, True, False, 0, -1, 1, 2**63, 10**9, 1e9, float("nan"), float("inf"), 1.5,
              "", "x", "bert", "gelu", "LABEL_0"]  # fmt: skip
    if kind <= 5:
        return rng.choice(simple + [rng.randint(-(10**6), 10**6)])
    if kind <= 7:
        return [random_json(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rng.choice(["0", "1", "a", "hidden_size"]): random_json(rng, depth + 1) for _ in "ab"}


CONFIG_KEYS = ["architectures", "id2label", "label2id", "num_labels", "hidden_size",
               "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
               "max_position_embeddings", "n_positions", "hidden_act", "text_config",
               "hidden_sizes", "depths", "image_size", "model_type"]  # fmt: skip
TINY_BERT = {"model_type": "bert", "hidden_size": 32, "num_attention_heads": 2,
             "num_hidden_layers": 1, "intermediate_size": 64, "vocab_size": 100}  # fmt: skip


def config_case(path: Path, content: bytes) -> Callable[[], str | None]:
    def case() -> None:
        path.write_bytes(content)
        sources.from_config_file.cache_clear()
        catalog._config_dict.cache_clear()
        entry = models.find_model(f"file:{path}")
        for task in entry.tasks:  # an accepted config is built too (meta device: no memory)
            models.parameter_count(entry, task)

    return case


def config_cases(
    rng: random.Random, n: int, folder: Path
) -> Iterator[tuple[str, Callable[[], str | None]]]:
    path = folder / "config.json"
    fixed = [b"", b"{", b"[]", b"null", b"{}", b'{"model_type": null}', b"\xff\xfe",
             b"[" * 200_000 + b"]" * 200_000, b'{"a":' * 5000 + b"1" + b"}" * 5000,
             b'{"model_type": "bert", "vocab_size": ' + b"9" * 5000 + b"}",
             json.dumps({**TINY_BERT, "num_labels": 1e9}).encode(),
             json.dumps({**TINY_BERT, "id2label": {str(i): "x" for i in range(20_000)}}).encode(),
             b" " * (2**20 + 1)]  # fmt: skip
    for content in fixed:
        yield f"config {content[:60]!r}", config_case(path, content)
    for _ in range(n):
        data = dict(TINY_BERT)
        for key in rng.sample(CONFIG_KEYS, rng.randint(1, 3)):
            data[key] = random_json(rng)
        yield f"config {data!r:.100}", config_case(path, json.dumps(data).encode())


def path_cases(folder: Path) -> Iterator[tuple[str, Callable[[], str | None]]]:
    fifo = folder / "fifo.json"
    os.mkfifo(fifo)
    sparse = folder / "sparse.json"
    with open(sparse, "wb") as f:
        f.truncate(10 * 2**30)  # 10 GiB that take no disk
    link = folder / "zero.json"
    link.symlink_to("/dev/zero")
    for path in ["/dev/zero", "/dev/null", "/dev/urandom", str(fifo), str(sparse), str(link),
                 str(folder), "/", "/proc/self/mem", "/proc/self/environ", "/nonexistent/x.json",
                 str(folder / "a\x00b"), "~" * 5000, "x" * 5000]:  # fmt: skip
        yield f"path {path!r:.60}", _settings(f"file:{path}")
        yield (
            f"cli --config-file {path!r:.60}",
            cli_case(["measure", "--config-file", path, "--batch-size", "1"]),
        )


def _settings(model: str) -> Callable[[], None]:
    def case() -> None:
        Settings(model=model)

    return case


def spec_cases() -> Iterator[tuple[str, Callable[[], str | None]]]:
    for spec in SPECS:
        yield f"spec {spec!r:.60}", _settings(spec)


@contextlib.contextmanager
def offline_and_stubbed() -> Iterator[None]:
    """The hub unreachable (no request leaves), and the CLI's engine calls stubbed."""

    def offline(*args: object, **kwargs: object) -> None:
        raise OSError("offline (fuzz_inputs)")

    saved = (huggingface_hub.get_hf_file_metadata, huggingface_hub.hf_hub_download)
    huggingface_hub.get_hf_file_metadata = huggingface_hub.hf_hub_download = offline
    try:
        yield
    finally:
        huggingface_hub.get_hf_file_metadata, huggingface_hub.hf_hub_download = saved


@contextlib.contextmanager
def engine_stubbed() -> Iterator[None]:
    def reached(*args: object, **kwargs: object) -> None:
        raise commands.StepError("reached the engine")

    saved = commands.Session
    commands.Session = reached
    try:
        yield
    finally:
        commands.Session = saved


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--cases", type=int, default=300, help="random cases per family")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    rng = random.Random(args.seed)
    signal.signal(signal.SIGALRM, _alarm)
    families: list[Family] = []
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp, offline_and_stubbed():
        folder = Path(tmp)
        with engine_stubbed():
            plan = [
                ("query parameters", query_cases(rng, args.cases)),
                ("CLI flags", cli_cases(rng, args.cases)),
                ("config.json contents", config_cases(rng, args.cases, folder)),
                ("paths", path_cases(folder)),
                ("model specs", spec_cases()),
            ]
            for name, cases in plan:
                families.append(_run_family(name, cases))
        families.append(_run_family("CLI, real tiny runs", real_cli_cases(rng, 10)))
    return _print(families, time.perf_counter() - started, args.seed)


def _run_family(name: str, cases: Iterator[tuple[str, Callable[[], str | None]]]) -> Family:
    family = Family(name)
    for label, case in cases:
        run_case(family, label, case)
    return family


def _print(families: list[Family], seconds: float, seed: int) -> int:
    print(f"{'entry point':<24} {'tried':>6} {'refused':>8} {'failures':>9} {'slowest s':>10}")
    for f in families:
        print(f"{f.name:<24} {f.tried:>6} {f.refused:>8} {len(f.failures):>9} "
              f"{f.slowest_seconds:>10.2f}")  # fmt: skip
        for failure in f.failures[:10]:
            print(f"    FAIL {failure}")
    tried = sum(f.tried for f in families)
    failed = sum(len(f.failures) for f in families)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(
        f"fuzz_inputs: {tried} cases tried, {failed} failures (seed {seed}, "
        f"{seconds:.0f} s, peak memory {peak_mib:.0f} MiB)"
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
