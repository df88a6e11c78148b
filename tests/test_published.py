"""The published-measurements table: its rows are well-formed, and each quantity is compared with
the right prediction. No simulation runs here (`measure` is replaced where it would)."""

import re

import pytest

from benchmarks import published
from benchmarks.published import ROWS, PublishedRow, predict
from memorymark.gpus import find_gpu
from memorymark.measurement import Measurement
from memorymark.models import sources
from memorymark.settings import Settings
from memorymark.units import MIB


@pytest.fixture(autouse=True)
def any_config_path():
    """The app limits config files to its upload folder once imported; the ViT rows read
    benchmarks/configs/."""
    before = sources._config_root
    sources.restrict_config_files(None)
    yield
    sources.restrict_config_files(before)


def _printed_figure(row: PublishedRow) -> str:
    """The figure as the source printed it: MB (MiB, pynvml's //1024**2), GiB (torchtune's
    tables, one decimal) or GB (1e9 bytes)."""
    if "GiB" in row.quote:
        return f"{row.measured_bytes / 2**30:.1f} GiB"
    if row.measured_bytes % MIB == 0:
        return f"{row.measured_bytes // MIB} MB"
    return f"{row.measured_bytes / 1e9:.2f} GB"


@pytest.mark.parametrize("row", ROWS, ids=[r.experiment for r in ROWS])
def test_each_row_cites_its_source_and_quotes_the_figure(row):
    assert re.fullmatch(r"https://github\.com/[\w.-]+/[\w.-]+/blob/[0-9a-f]{40}/\S+", row.source)
    assert _printed_figure(row) in row.quote
    assert row.measured_bytes > 0 and row.batch_size >= 1
    assert row.quantity in published.QUANTITIES
    find_gpu(row.gpu)  # raises for a GPU outside the catalog


@pytest.mark.parametrize("row", ROWS, ids=[r.experiment for r in ROWS])
def test_each_rows_settings_build_a_simulated_run_on_its_gpu(row):
    settings = row.to_settings()
    assert isinstance(settings, Settings)
    assert (settings.hardware.backend, settings.hardware.gpu) == ("sim", row.gpu)
    assert "backend" not in row.settings and "gpu" not in row.settings


def test_rows_are_unique_and_every_source_is_named():
    assert len({(r.source, r.quote) for r in ROWS}) == len(ROWS)
    urls = {url for url, _ in published.SOURCES.values()}
    assert {r.source for r in ROWS} == urls


def test_a_row_with_an_unknown_quantity_or_no_url_is_refused():
    good = ROWS[0]
    fields = {f: getattr(good, f) for f in good.__dataclass_fields__}
    with pytest.raises(ValueError, match="quantity must be one of"):
        PublishedRow(**{**fields, "quantity": "peak"})
    with pytest.raises(ValueError, match="source must be a URL"):
        PublishedRow(**{**fields, "source": "the docs"})
    with pytest.raises(ValueError, match="device-used figures only"):
        PublishedRow(**{**fields, "quantity": "reserved"})


def _fake_measure(monkeypatch, allocated, reserved):
    class FakeSession:
        def __init__(self, settings):
            self.settings = settings

        def measure(self, batch_size):
            return Measurement(
                batch_size=batch_size,
                fits=True,
                peak_bytes=allocated,
                backend="sim",
                measured=False,
                predicted_allocated_bytes=allocated,
                predicted_reserved_bytes=reserved,
            )

    monkeypatch.setattr(published, "Session", FakeSession)


def _row(quantity, context_bytes=None, measured_bytes=1000 * MIB):
    return PublishedRow(
        source="https://example.org/log",
        quote="Memory used: 1 GB",
        experiment="x",
        model="BERT",
        gpu="A100 40GB",
        settings={"model": "tiny-bert"},
        batch_size=2,
        measured_bytes=measured_bytes,
        quantity=quantity,
        context_bytes=context_bytes,
    )


def test_each_quantity_is_compared_with_its_own_prediction(monkeypatch):
    _fake_measure(monkeypatch, allocated=800 * MIB, reserved=900 * MIB)
    assert predict(_row("allocated")).predicted_bytes == 800 * MIB
    assert predict(_row("reserved")).predicted_bytes == 900 * MIB
    measured_context = predict(_row("device-used", context_bytes=100 * MIB))
    assert measured_context.predicted_bytes == 1000 * MIB
    assert measured_context.error == 0.0
    estimated = predict(_row("device-used"))
    assert estimated.context_bytes == find_gpu("A100 40GB").context_bytes
    assert estimated.predicted_bytes == 900 * MIB + estimated.context_bytes


def test_error_is_signed_relative_to_the_measurement(monkeypatch):
    _fake_measure(monkeypatch, allocated=900 * MIB, reserved=900 * MIB)
    assert predict(_row("allocated")).error == pytest.approx(-0.1)
    assert predict(_row("allocated", measured_bytes=750 * MIB)).error == pytest.approx(0.2)
