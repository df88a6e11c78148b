"""Counts a person reads say `1 GPU`, never `1 GPUs`: the helper, and the CLI lines that print
a GPU count (the app's are checked on their pages: tests/test_scale_out_page.py)."""

from __future__ import annotations

import pytest

from memorymark.cli import render
from memorymark.measurement import Measurement
from memorymark.search.gpu_count import GpuSearch
from memorymark.settings import Settings
from memorymark.units import plural

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


def test_plural_is_singular_for_one_only() -> None:
    assert plural(1, "GPU") == "1 GPU"
    assert plural(0, "GPU") == "0 GPUs"
    assert plural(8, "probe") == "8 probes"
    assert plural(1024, "GPU") == "1,024 GPUs"
    assert plural(2, "child", "children") == "2 children"


def step(runs: bool) -> Measurement:
    return Measurement(batch_size=1, fits=runs, peak_bytes=1, backend="sim", measured=False)


def test_the_cli_gpu_search_says_1_gpu(capsys: pytest.CaptureFixture[str]) -> None:
    render.print_gpu_search(GpuSearch(min_gpus=2, tried=((1, step(False)), (2, step(True)))))
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "       1 GPU: batch 1 does not run"
    assert lines[1] == "      2 GPUs: batch 1 fits"
    render.print_gpu_search(GpuSearch(min_gpus=None, tried=((1, step(False)),)))
    assert "no count up to 1 GPU fits batch 1" in capsys.readouterr().out


def test_the_cli_header_says_1_node() -> None:
    s = Settings(model="tiny-gpt2", dist="fsdp", gpus="2")
    assert render.ranks_text(s) == " x2 (1 node, fsdp)"
