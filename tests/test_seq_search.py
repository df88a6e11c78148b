"""`analyze --find seq-len`: the longest sequence at a fixed batch, searched by the same sweep
and strategies as batch sizes (a backend whose memory is a known function of length, then the
simulation end to end on a tiny Llama)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from config_samples import TINY_LLAMA

from memorymark import Session, Settings
from memorymark.cli import parser
from memorymark.measurement import Measurement
from memorymark.search.seq_len import SeqLenAnswer, SeqLenMeasurer, search_cap
from memorymark.search.strategies import FastStrategy, LinearStrategy
from memorymark.search.sweep import sweep


class LengthBackend:
    """Peak = base + per_token x batch x seq_len: what a fixed-batch step needs."""

    def __init__(self, capacity_bytes: int, base: int = 1000, per_token: int = 10) -> None:
        self.capacity_bytes = capacity_bytes
        self.base, self.per_token = base, per_token
        self.training_step = None
        self.tried: list[tuple[int, int]] = []
        self.released = False

    def measure(self, batch_size: int) -> Measurement:
        seq_len = (
            self.training_step.settings.workload.seq_len
        )  # set by the measurer before each probe
        self.tried.append((seq_len, batch_size))
        peak = self.base + self.per_token * batch_size * seq_len
        return Measurement(
            batch_size=batch_size,
            fits=peak <= self.capacity_bytes,
            runs=peak <= self.capacity_bytes,
            peak_bytes=peak,
            required_bytes=peak,
            backend="fake",
            measured=False,
            timeline=(self.base, peak),
        )

    def release(self) -> None:
        self.released = True


@pytest.mark.parametrize("strategy", [FastStrategy, LinearStrategy])
def test_the_longest_sequence_at_a_batch_is_found_on_the_grid(strategy: type) -> None:
    settings = Settings(model="tiny-gpt2", seq_step=16)
    backend = LengthBackend(capacity_bytes=1000 + 10 * 2 * 100)  # batch 2: 100 tokens fit
    measurer = SeqLenMeasurer(backend, settings, batch_size=2)
    probes = list(sweep(measurer, strategy(step=16, max_batch=128, capacity_bytes=3000)))
    assert backend.released and all(batch == 2 for _, batch in backend.tried)
    lengths = [m.batch_size for m in probes]  # the sweep saw lengths where batches go
    answer = SeqLenAnswer(
        settings=settings,
        batch_size=2,
        probes=tuple((n, measurer.probes[n]) for n in lengths),
        search_cap=128,
        gpu_name="fake",
        gpu_total_bytes=2**30,
        usable_bytes=2**30,
        memory_source="simulated",
        elapsed_seconds=0.0,
    )
    assert answer.optimal_seq_len == 96  # 96 x 2 x 10 + 1000 <= 3000 < 112 x 2 x 10 + 1000
    assert not answer.capped
    data = answer.to_dict()
    assert data["optimal_seq_len"] == 96 and data["batch_size"] == 2
    assert {r["seq_len"] for r in data["results"]} == set(lengths)
    # Each result is the backend's own measurement, at the batch it really ran.
    assert all(measurer.probes[n].batch_size == 2 for n in lengths)


def test_the_search_stops_at_the_models_positions() -> None:
    assert search_cap(Settings(model="tiny-gpt2", seq_step=48), 128) == 96
    assert search_cap(Settings(model="tiny-gpt2", seq_step=1024), 128) == 128
    assert search_cap(Settings(model="t5-small", seq_step=1024), None) == 131072


@pytest.mark.usefixtures("any_config_path")  # a tmp_path config, wherever the app limits them
def test_find_seq_len_on_a_tiny_llama_is_bounded_by_memory(tmp_path: Path) -> None:
    # A 2-layer Llama with a 32k vocabulary: at batch 1 the fp32 logits alone take 128 KiB a
    # token, so a 1 GiB card stops it well below its 4096 positions.
    path = tmp_path / "llama.json"
    path.write_text(json.dumps({**TINY_LLAMA, "vocab_size": 32768}))
    settings = Settings(
        model=f"file:{path}",
        find="seq-len",
        current_batch=1,
        seq_step=256,
        precision="bf16-true",
        gpu_memory_gib=1,
        backend="sim",
    )
    session = Session(settings)
    answer = session.find_seq_len()
    best = answer.optimal_seq_len
    assert best is not None and 256 <= best < 4096 and best % 256 == 0
    by_len = dict(answer.probes)
    assert by_len[best].fits
    assert any(n > best and not m.fits for n, m in answer.probes)
    assert answer.to_dict()["optimal_seq_len"] == best


def test_cli_prints_optimal_seq_len_as_json(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["analyze", "tiny-gpt2", "--find", "seq-len", "--batch-size", "2"]
    argv += ["--seq-step", "32", "--gpu", "a10", "--backend", "sim", "--json"]
    assert parser.main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["optimal_seq_len"] == 128 and data["capped_by_positions"] is True
    assert data["batch_size"] == 2


def test_seq_len_search_needs_a_text_model() -> None:
    with pytest.raises(ValueError, match="text model"):
        Settings(model="tiny-resnet", find="seq-len")
    with pytest.raises(ValueError, match="find must be one of"):
        Settings(model="tiny-gpt2", find="width")


def test_settings_round_trip_the_new_flags() -> None:
    s = Settings(
        model="llama-3.2-1b",
        find="seq-len",
        seq_step=512,
        current_batch=1,
        kernels="liger",
        attention="flash_attention_2",
        precision="bf16-true",
    )
    line = s.to_command_line()
    assert "--find seq-len" in line and "--kernels liger" in line and "--seq-step 512" in line
    args = parser.build_parser().parse_args(line.split()[1:])
    assert parser.settings_from_args(args) == s
    assert Settings.from_query(s.to_query()) == s
