"""Calibration: rows pair a measured first step with the simulation, stamped with the environment,
written in the docs/calibration contract; --emulate-gpu caps the allocator and checks the
predicted boundary. The GPU is a fake `torch.cuda` module throughout; without one, calibrate says
so."""

import contextlib
import csv
import datetime
import functools
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from benchmarks.calibration_table import summary, table
from memorymark.backends.device import CpuBackend, DeviceBackend
from memorymark.backends.sim import SimBackend
from memorymark.calibration import run as calibration
from memorymark.calibration.record import COLUMNS, CalibrationRow, file_stem, write
from memorymark.calibration.run import (
    RECOMMENDED_MARGIN,
    boundary_checks,
    calibrate,
    cap_fraction,
    settings_grid,
)
from memorymark.cli.parser import build_parser, main
from memorymark.environment import GpuEnvironment, driver_version, git_commit, memorymark_version
from memorymark.fit import FitPolicy
from memorymark.gpus import find_gpu
from memorymark.measurement import Measurement
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

ROOT = Path(__file__).resolve().parents[1]
BIG = 8 * 2**30
A10_TOTAL = 23609475072  # an A10 as an older driver reported it (the fake device)
DAY = datetime.date(2026, 5, 10)
NVML = SimpleNamespace(
    nvmlInit=lambda: None,
    nvmlShutdown=lambda: None,
    nvmlSystemGetDriverVersion=lambda: "550.54.15",
)

# The contract of docs/calibration/*.csv, spelled out: changing it is changing the contract.
CONTRACT = (
    "gpu_name",
    "gpu_total_bytes",
    "emulated_gpu",
    "torch_version",
    "cuda_version",
    "driver_version",
    "memorymark_version",
    "git_commit",
    "model",
    "task",
    "precision",
    "optimizer",
    "grad_checkpointing",
    "lora_rank",
    "protocol",
    "seq_len",
    "image_size",
    "batch_size",
    "grad_accum",
    "boundary_check",
    "capacity_bytes",
    "measured_allocated_bytes",
    "measured_reserved_bytes",
    "measured_fits",
    "alloc_retries",
    "num_ooms",
    "predicted_allocated_bytes",
    "predicted_reserved_bytes",
    "predicted_fits",
    "allocated_error",
    "reserved_error",
    "verdict_agrees",
)


class FakeCuda:
    """The torch.cuda calls calibration makes, on CPU: an A10 whose peaks and allocator counters
    the test sets, and a memory fraction that is recorded."""

    def __init__(self, *, available: bool = True) -> None:
        self.available = available
        self.fractions: list[tuple[float, int]] = []
        self.peaks = (5000, 8192)  # allocated, reserved
        self.counters = {"num_alloc_retries": 0, "num_ooms": 0}

    def is_available(self):
        return self.available

    def get_device_properties(self, index):
        return SimpleNamespace(name="NVIDIA A10", total_memory=A10_TOTAL, major=8, minor=6)

    def mem_get_info(self, device=None):
        return A10_TOTAL // 2, A10_TOTAL

    def set_per_process_memory_fraction(self, fraction, device=None):
        self.fractions.append((fraction, device))

    @property
    def cap_bytes(self) -> int:
        """What the allocator may reserve under the last fraction set (of the total)."""
        return int((self.fractions[-1][0] if self.fractions else 1.0) * A10_TOTAL)

    def memory_stats(self):
        allocated, reserved = self.peaks
        return {
            "allocated_bytes.all.peak": allocated,
            "reserved_bytes.all.peak": reserved,
            "active_bytes.all.peak": allocated,
            **self.counters,
        }

    def reset_peak_memory_stats(self):
        pass

    def max_memory_allocated(self):
        return 1234  # not what calibration reads: the first step's memory_stats() are

    def max_memory_reserved(self):
        return self.peaks[1]

    def synchronize(self):
        pass

    def empty_cache(self):
        pass


def cpu_stand_in(settings, gpu):
    """Real CPU kernels under the tracker: with the CUDA rules off, the simulation must match."""
    return CpuBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG))


def cpu_sim(settings, gpu):
    return SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG), cuda_rules=False)


def test_the_grid_has_each_combination_once_inference_style_without_an_optimizer():
    grid = settings_grid(["tiny-bert"], optimizers=["adamw", "sgd"], seq_len=16)
    assert [(s.protocol, s.optimizer, s.margin) for s in grid] == [
        ("full", "adamw", "0%"),
        ("inference-style", "none", "0%"),
        ("full", "sgd", "0%"),
    ]
    with pytest.raises(ValueError, match="protocol must be one of"):
        settings_grid(["tiny-bert"], protocols=["forward"])


def test_rows_compare_simulation_with_a_real_run():
    rows = list(
        calibrate(
            settings_grid(["tiny-bert"], seq_len=32),
            (2, 4),
            cuda=FakeCuda(),
            real=cpu_stand_in,
            simulated=cpu_sim,
            nvml=NVML,
        )
    )
    assert [(r.protocol, r.batch_size) for r in rows] == [
        ("full", 2),
        ("full", 4),
        ("inference-style", 2),
        ("inference-style", 4),
    ]
    assert all(r.allocated_error == 0.0 and r.reserved_error == 0.0 for r in rows)
    assert all(r.measured_fits and r.predicted_fits and r.verdict_agrees for r in rows)
    full, inference = rows[1], rows[3]
    assert inference.measured_allocated_bytes < full.measured_allocated_bytes
    assert (full.seq_len, full.image_size, full.task) == (32, None, "sequence-classification")
    assert (inference.optimizer, full.optimizer) == ("none", "adamw")


def test_a_cuda_row_reads_the_first_steps_memory_stats_and_counts_its_own_retries_and_ooms():
    cuda = FakeCuda()
    cuda.counters["num_ooms"] = 3  # earlier in the process: not this probe's

    class Step(CatalogStep):
        def run_step(self, model, optimizer, batch_size, *args, **kwargs):
            if batch_size >= 64:
                cuda.counters["num_ooms"] += 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            if batch_size == 4:  # every step retries twice; only the first one's count
                cuda.counters["num_alloc_retries"] += 2
            return super().run_step(model, optimizer, batch_size, *args, **kwargs)

    def device(settings, gpu):
        return DeviceBackend(
            Step(settings),
            policy=FitPolicy(capacity_bytes=gpu.usable_bytes),
            name="cpu",
            device_module=cuda,
            peak_stats=True,
            timed_steps=1,
        )

    grid = settings_grid(["tiny-bert"], protocols=["full"], seq_len=16)
    rows = list(calibrate(grid, (2, 4, 64), cuda=cuda, real=device, nvml=NVML))
    figures = [
        (
            r.batch_size,
            r.measured_allocated_bytes,
            r.measured_reserved_bytes,
            r.alloc_retries,
            r.num_ooms,
            r.measured_fits,
            r.predicted_fits,
            r.verdict_agrees,
        )
        for r in rows
    ]
    assert figures == [
        (2, 5000, 8192, 0, 0, True, True, True),
        # It completed after flushing the cache: it runs (never recommended), its retries counted.
        (4, 5000, 8192, 2, 0, True, True, True),
        (64, None, None, 0, 1, False, True, False),
    ]
    assert rows[0].capacity_bytes == A10_TOTAL - find_gpu("A10").context_bytes  # as detected
    assert rows[0].predicted_reserved_bytes > rows[0].predicted_allocated_bytes > 0


def test_rows_are_stamped_and_written_as_csv_and_json_in_the_contract(tmp_path):
    rows = list(
        calibrate(
            settings_grid(["tiny-resnet"], protocols=["full"], image_size=32),
            (2,),
            cuda=FakeCuda(),
            real=cpu_stand_in,
            simulated=cpu_sim,
            nvml=NVML,
        )
    )
    env = rows[0].environment
    assert (env.gpu_name, env.gpu_total_bytes, env.emulated_gpu) == ("NVIDIA A10", A10_TOTAL, "")
    assert (env.torch_version, env.cuda_version) == (torch.__version__, torch.version.cuda or "")
    assert (env.driver_version, env.memorymark_version) == ("550.54.15", memorymark_version())
    assert COLUMNS == CONTRACT and tuple(rows[0].to_dict()) == CONTRACT

    csv_path, json_path = write(rows, tmp_path, DAY)
    assert (csv_path.name, json_path.name) == (
        "nvidia-a10-2026-05-10.csv",
        "nvidia-a10-2026-05-10.json",
    )
    with csv_path.open() as f:
        reader = csv.DictReader(f)
        assert tuple(reader.fieldnames) == CONTRACT
        (record,) = list(reader)
    assert record["model"] == "tiny-resnet" and record["image_size"] == "32"
    assert (record["seq_len"], record["boundary_check"]) == ("", "")
    assert (record["measured_fits"], record["grad_checkpointing"]) == ("true", "false")
    assert record["reserved_error"] == "0.0"
    assert int(record["measured_reserved_bytes"]) == rows[0].measured_reserved_bytes
    (twin,) = json.loads(json_path.read_text())
    assert twin == rows[0].to_dict() and twin["seq_len"] is None


def test_file_names_say_the_gpu_the_emulated_gpu_and_the_day():
    assert file_stem("NVIDIA A100-SXM4-80GB", "", DAY) == "nvidia-a100-sxm4-80gb-2026-05-10"
    assert (
        file_stem("NVIDIA H100 80GB HBM3", "A10G", DAY)
        == "nvidia-h100-80gb-hbm3-as-a10g-2026-05-10"
    )


class CappedDevice:
    """A GPU whose step reserves `cap * batch / full_at` bytes and runs out of memory past the
    cap the fake cuda module was given: the allocator's behaviour under a memory fraction."""

    name, measured = "cuda", True

    def __init__(self, cuda: FakeCuda, full_at: float) -> None:
        self.cuda, self.full_at = cuda, full_at

    def measure(self, batch_size: int) -> Measurement:
        reserved = int(self.cuda.cap_bytes * batch_size / self.full_at)
        ran = reserved <= self.cuda.cap_bytes
        if ran:
            self.cuda.peaks = (reserved * 9 // 10, reserved)
        else:
            self.cuda.counters["num_ooms"] += 1
        return Measurement(
            batch_size=batch_size,
            fits=ran,
            peak_bytes=self.cuda.peaks[0],
            reserved_bytes=reserved if ran else None,
            required_bytes=reserved if ran else None,
            alloc_retries=0 if ran else None,
            memory_stats=self.cuda.memory_stats(),
            backend="cuda",
            measured=True,
            error=None if ran else "CUDA out of memory.",
        )

    @contextlib.contextmanager
    def session(self):
        yield self


def test_emulation_caps_the_allocator_at_the_gpus_capacity_and_checks_the_predicted_boundary():
    # GPT-2 at seq 128 on a T4 (step 8): the simulation recommends 56, says 64 runs (inside
    # the margin) and 72 does not (the replayed loop runs out of memory).
    cuda = FakeCuda()
    t4 = find_gpu("T4")
    rows = list(
        calibrate(
            settings_grid(["gpt2"], protocols=["full"]),
            (8,),
            emulate=t4,
            cuda=cuda,
            real=lambda settings, gpu: CappedDevice(cuda, full_at=60),
            nvml=NVML,
        )
    )
    # The fraction is of the total cudaMemGetInfo reports, and it is lifted at the end.
    assert cuda.fractions == [(t4.usable_bytes / A10_TOTAL, 0), (1.0, 0)]
    assert [(r.batch_size, r.boundary_check) for r in rows] == [
        (8, ""),
        (56, "recommended"),
        (64, "max fits"),
        (72, "max+step OOM"),
    ]
    assert {(r.environment.emulated_gpu, r.capacity_bytes) for r in rows} == {
        ("T4", t4.usable_bytes)
    }
    _, recommended, at_max, past_max = rows
    assert (recommended.measured_fits, recommended.predicted_fits) == (True, True)
    assert (at_max.measured_fits, at_max.predicted_fits, at_max.verdict_agrees) == (True,) * 3
    capped_bytes = int(cuda.fractions[0][0] * A10_TOTAL)
    assert at_max.measured_reserved_bytes == int(capped_bytes * 56 / 60)
    assert at_max.predicted_reserved_bytes <= t4.usable_bytes
    assert (past_max.measured_fits, past_max.predicted_fits, past_max.verdict_agrees) == (
        False,
        False,
        True,
    )
    assert (past_max.num_ooms, past_max.measured_reserved_bytes) == (1, None)
    assert past_max.predicted_reserved_bytes > at_max.predicted_reserved_bytes


def test_a_boundary_the_gpu_disagrees_with_is_reported_as_such():
    cuda = FakeCuda()
    rows = list(
        calibrate(
            settings_grid(["tiny-gpt2"], protocols=["full"], seq_len=16),
            (),
            emulate=find_gpu("T4"),
            cuda=cuda,
            real=lambda settings, gpu: CappedDevice(cuda, full_at=50),  # OOMs from batch 51
            boundary=lambda settings, gpu: (56, 8),
            nvml=NVML,
        )
    )
    assert [(r.boundary_check, r.measured_fits, r.verdict_agrees) for r in rows] == [
        ("max fits", False, False),
        ("max+step OOM", False, False),  # tiny-gpt2 at 64 runs on a T4 in the simulation
    ]


def test_emulating_a_larger_gpu_is_refused_before_anything_is_capped():
    cuda = FakeCuda()
    with pytest.raises(ValueError, match=r"^cannot emulate A100 80GB \(.* GiB usable\) on A10"):
        next(calibrate(settings_grid(["tiny-bert"]), emulate=find_gpu("A100 80GB"), cuda=cuda))
    assert cuda.fractions == []
    # An L4 is 25 MB smaller than an A10: it can be emulated.
    assert cap_fraction(cuda, find_gpu("L4"), find_gpu("A10")) == pytest.approx(
        find_gpu("L4").usable_bytes / A10_TOTAL
    )


def test_cli_prints_a_line_per_row_and_writes_dated_files(tmp_path, monkeypatch, capsys):
    patched = functools.partial(
        calibration.calibrate, cuda=FakeCuda(), real=cpu_stand_in, simulated=cpu_sim, nvml=NVML
    )
    monkeypatch.setattr(calibration, "calibrate", patched)
    status = main(
        [
            "calibrate",
            "--models",
            "tiny-bert",
            "--seq-len",
            "16",
            "--batch-sizes",
            "2",
            "--protocols",
            "full",
            "--grad-checkpointing",  # alone: on
            "--out",
            str(tmp_path),
        ]
    )
    out, err = capsys.readouterr()
    assert status == 0, err
    lines = out.splitlines()
    assert len(lines) == 2
    assert re.match(r"tiny-bert +full +32-true +batch +2  allocated .* GiB +\+0\.00%", lines[0])
    assert lines[0].endswith("runs/runs agree")
    (csv_path,) = tmp_path.glob("*.csv")
    assert re.fullmatch(r"nvidia-a10-\d{4}-\d{2}-\d{2}\.csv", csv_path.name)
    assert lines[1] == f"wrote {csv_path} and {csv_path.with_suffix('.json')}"
    with csv_path.open() as f:
        (record,) = csv.DictReader(f)
    assert record["grad_checkpointing"] == "true"
    assert build_parser().parse_args(["calibrate"]).grad_checkpointing == ["off"]


def test_an_unknown_emulated_gpu_is_one_line_and_exit_2_even_without_a_gpu(capsys):
    status = main(["calibrate", "--emulate-gpu", "Z80"])
    _, err = capsys.readouterr()
    assert status == 2
    assert err.startswith("memorymark: error: unknown GPU 'Z80';") and err.count("\n") == 1


def test_without_a_gpu_calibrate_exits_non_zero_with_one_line(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "memorymark", "calibrate", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 1
    assert proc.stderr == "memorymark: error: calibrate needs a CUDA GPU and PyTorch sees none\n"


# -- environment stamps ------------------------------------------------------------------------
def test_the_driver_version_comes_from_nvml_and_is_empty_when_nvml_cannot_say():
    shutdowns = []
    old_pynvml = SimpleNamespace(
        nvmlInit=lambda: None,
        nvmlShutdown=lambda: shutdowns.append(1),
        nvmlSystemGetDriverVersion=lambda: b"535.104.05",
    )
    assert driver_version(old_pynvml) == "535.104.05" and shutdowns == [1]

    def no_driver():
        raise RuntimeError("NVML Shared Library Not Found")

    assert driver_version(SimpleNamespace(nvmlInit=no_driver)) == ""


def git(repo, *args):
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
    )


def test_git_commit_is_the_checkouts_head_dirty_when_tracked_files_changed(tmp_path):
    assert git_commit(tmp_path) == ""  # not a checkout
    git(tmp_path, "init", "-q")
    (tmp_path / "a.txt").write_text("1")
    git(tmp_path, "add", "a.txt")
    git(tmp_path, "commit", "-q", "-m", "one")
    head = subprocess.run(
        ["git", "-C", str(tmp_path), "rev-parse", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    (tmp_path / "untracked.txt").write_text("ignored")
    assert git_commit(tmp_path) == head and re.fullmatch(r"[0-9a-f]{40}", head)
    (tmp_path / "a.txt").write_text("2")
    assert git_commit(tmp_path) == f"{head}-dirty"


def test_memorymark_version_matches_the_project_metadata():
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert memorymark_version() == re.search(r'^version = "(.+)"', pyproject, re.M).group(1)


# -- the README accuracy table -----------------------------------------------------------------
def test_the_accuracy_table_says_so_when_there_is_no_data(tmp_path):
    assert table(tmp_path) == summary(tmp_path) == "no calibration data yet"


def test_the_accuracy_table_reads_every_csv(tmp_path):
    env = GpuEnvironment(
        gpu_name="NVIDIA A10",
        gpu_total_bytes=A10_TOTAL,
        emulated_gpu="",
        torch_version="2.13.0",
        cuda_version="12.8",
        driver_version="550.54.15",
        memorymark_version="0.1.0",
        git_commit="",
    )
    row = CalibrationRow(
        environment=env,
        model="bert",
        task="sequence-classification",
        precision="bf16-mixed",
        optimizer="adamw",
        grad_checkpointing=True,
        lora_rank=0,
        protocol="full",
        seq_len=128,
        image_size=None,
        batch_size=64,
        grad_accum=1,
        capacity_bytes=find_gpu("A10").usable_bytes,
        measured_allocated_bytes=9 * 2**30,
        measured_reserved_bytes=10 * 2**30,
        measured_fits=True,
        alloc_retries=0,
        num_ooms=0,
        predicted_allocated_bytes=int(9.2 * 2**30),
        predicted_reserved_bytes=int(10.5 * 2**30),
        predicted_fits=True,
    )
    write([row], tmp_path, DAY)
    oom = CalibrationRow(
        **{
            **{f: getattr(row, f) for f in row.__dataclass_fields__},
            "environment": GpuEnvironment(**{**env.to_dict(), "emulated_gpu": "T4"}),
            "batch_size": 72,
            "boundary_check": "max+step OOM",
            "measured_allocated_bytes": None,
            "measured_reserved_bytes": None,
            "measured_fits": False,
        }
    )
    write([oom], tmp_path, DAY)
    assert summary(tmp_path).splitlines() == [
        "| GPU | rows | allocated error, median / worst | reserved error, median / worst "
        "| verdicts agree |",
        "| --- | ---: | ---: | ---: | ---: |",
        "| NVIDIA A10 | 1 | 2.2% / +2.2% | 5.0% / +5.0% | 1 of 1 |",
        "| NVIDIA A10 as T4 | 1 | n/a | n/a | 0 of 1 |",
        "| all | 2 | 2.2% / +2.2% | 5.0% / +5.0% | 1 of 2 |",
        "",
        "Verdicts that disagree: 1",
        "- NVIDIA A10 as T4, bert, full bf16-mixed adamw, checkpointing, seq 128, batch 72 "
        "(max+step OOM): measured OOM, predicted runs",
    ]
    assert table(tmp_path).splitlines() == [
        "| GPU | model | settings | batch | measured reserved GiB | predicted reserved GiB "
        "| error | verdict |",
        "| --- | --- | --- | --- | ---: | ---: | ---: | --- |",
        "| NVIDIA A10 | bert | full bf16-mixed adamw, checkpointing, seq 128 | 64 | 10.000 "
        "| 10.500 | +5.0% | agree: runs |",
        "| NVIDIA A10 as T4 | bert | full bf16-mixed adamw, checkpointing, seq 128 "
        "| 72 (max+step OOM) | OOM | 10.500 | n/a | DISAGREE: measured OOM, predicted runs |",
    ]


def test_a_combination_the_model_cannot_build_is_skipped_with_its_reason():
    cuda = FakeCuda()
    skipped = []
    grid = settings_grid(
        ["tiny-resnet", "tiny-bert"], grad_checkpointing=[True], protocols=["full"]
    )
    rows = list(
        calibrate(
            grid,
            (2,),
            cuda=cuda,
            nvml=NVML,
            real=lambda settings, gpu: CappedDevice(cuda, full_at=1000),
            on_skip=lambda s, why: skipped.append((s.model, why)),
        )
    )
    assert [r.model for r in rows] == ["tiny-bert"]
    assert [(model, "gradient checkpointing" in why) for model, why in skipped] == [
        ("tiny-resnet", True)
    ]


def test_the_recommended_batch_is_checked_below_the_maximum_only():
    assert boundary_checks(56, 8, 48) == [
        (48, "recommended"),
        (56, "max fits"),
        (64, "max+step OOM"),
    ]
    assert boundary_checks(56, 8, 56) == [(56, "max fits"), (64, "max+step OOM")]
    assert boundary_checks(0, 8, 0) == [(1, "max+step OOM")]


def test_recommendations_are_checked_at_the_apps_default_margin():
    assert Settings(model="bert").margin == RECOMMENDED_MARGIN


def test_the_readmes_accuracy_tables_are_the_committed_calibration_data():
    """Both READMEs show what `calibration_table.py --summary` prints from docs/calibration."""
    table_lines = [line for line in summary().splitlines() if line.startswith("|")]
    assert len(table_lines) > 3  # the header, its rule, at least one GPU and "all"
    for readme in (ROOT / "README.md", ROOT / "docs" / "calibration" / "README.md"):
        text = readme.read_text()
        assert all(line in text for line in table_lines), readme
