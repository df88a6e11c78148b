"""Calibration: rows pair a measured loop's steps with the simulation's replay of the same steps,
stamped with the environment, written in the docs/calibration contract; --emulate-gpu caps the
allocator and checks the predicted boundary. The GPU is a fake `torch.cuda` module throughout;
without one, calibrate says so."""

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
from memorymark.accounting.allocator import PROBE, TRAINING_LOOP, Prediction
from memorymark.backends.device import CpuBackend, DeviceBackend
from memorymark.backends.sim import SimBackend
from memorymark.calibration import run as calibration
from memorymark.calibration.loop import LOOP_STEPS, measured_loop, replayed_steps
from memorymark.calibration.record import COLUMNS, CalibrationRow, file_stem, split_cell, write
from memorymark.calibration.run import (
    RECOMMENDED_MARGIN,
    as_run,
    boundary_checks,
    calibrate,
    cap_fraction,
    settings_grid,
)
from memorymark.cli.parser import build_parser, main
from memorymark.environment import GpuEnvironment, driver_version, git_commit, memorymark_version
from memorymark.fit import FitPolicy
from memorymark.gpus import find_gpu
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
    # A loop's steps, one by one: after the columns files written before them have.
    "loop_steps",
    "measured_oom_step",
    "measured_allocated_per_step",
    "measured_reserved_per_step",
    "measured_retries_per_step",
    "predicted_retries",
    "predicted_oom_step",
    "predicted_allocated_per_step",
    "predicted_reserved_per_step",
    "predicted_retries_per_step",
    # How both loops reached step 1: after the loop columns, for the same reason.
    "loop_start",
    # What else shaped the step, and how a capped run was capped: last, likewise.
    "quantization",
    "kernels",
    "cap_method",
    "compile",
    "float8",
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
    assert [(s.workload.protocol, s.workload.optimizer, s.search.margin) for s in grid] == [
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
    # Step by step too: five steps each, the same replay on both sides.
    for r in rows:
        assert r.loop_steps == LOOP_STEPS == len(r.measured_reserved_per_step)
        assert r.measured_reserved_per_step == r.predicted_reserved_per_step
        assert r.measured_allocated_per_step == r.predicted_allocated_per_step
        assert r.measured_allocated_bytes == max(r.measured_allocated_per_step)
        assert r.predicted_retries_per_step == (0,) * LOOP_STEPS and r.predicted_retries == 0
    full, inference = rows[1], rows[3]
    assert inference.measured_allocated_bytes < full.measured_allocated_bytes
    assert (full.seq_len, full.image_size, full.task) == (32, None, "sequence-classification")
    assert (inference.optimizer, full.optimizer) == ("none", "adamw")


def test_a_cuda_row_is_the_peak_over_the_loops_steps_and_keeps_each_steps_figures():
    cuda = FakeCuda()
    cuda.counters["num_ooms"] = 3  # earlier in the process: not this loop's
    steps_run = {}

    class Step(CatalogStep):
        def run_step(self, model, optimizer, batch_size, *args, **kwargs):
            step = steps_run[batch_size] = steps_run.get(batch_size, 0) + 1
            if batch_size >= 64 or (batch_size == 8 and step == 2):
                cuda.counters["num_ooms"] += 1
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            if batch_size == 4:  # every step retries twice: the loop's count is all of them
                cuda.counters["num_alloc_retries"] += 2
            # The second step reserves more: what a loop's later steps may do.
            cuda.peaks = (5000 + 100 * (step > 1), 8192 + 4096 * (step > 1))
            return super().run_step(model, optimizer, batch_size, *args, **kwargs)

    def device(settings, gpu):
        return DeviceBackend(
            Step(settings),
            policy=FitPolicy(capacity_bytes=gpu.usable_bytes),
            name="cpu",
            device_module=cuda,
            peak_stats=True,
        )

    grid = settings_grid(["tiny-bert"], protocols=["full"], seq_len=16)
    rows = list(calibrate(grid, (2, 4, 8, 64), steps=3, cuda=cuda, real=device, nvml=NVML))
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
        (2, 5100, 12288, 0, 0, True, True, True),
        # It completed after flushing the cache: it runs (never recommended), its retries counted.
        (4, 5100, 12288, 6, 0, True, True, True),
        # Its second step ran out of memory: the first step's bytes are kept, the verdict is OOM.
        (8, 5000, 8192, 0, 1, False, True, False),
        (64, None, None, 0, 1, False, True, False),
    ]
    assert [
        (
            r.loop_steps,
            r.measured_oom_step,
            r.measured_reserved_per_step,
            r.measured_retries_per_step,
        )
        for r in rows
    ] == [
        (3, None, (8192, 12288, 12288), (0, 0, 0)),
        (3, None, (8192, 12288, 12288), (2, 2, 2)),
        (3, 2, (8192,), (0, 0)),
        (3, 1, (), (0,)),
    ]
    assert rows[0].capacity_bytes == A10_TOTAL - find_gpu("A10").context_bytes  # as detected
    assert rows[0].predicted_reserved_bytes > rows[0].predicted_allocated_bytes > 0
    # The prediction beside every row, for the same three steps.
    assert all(len(r.predicted_reserved_per_step) == 3 for r in rows)
    assert {r.predicted_retries for r in rows} == {0} and {r.predicted_oom_step for r in rows} == {
        None
    }


@pytest.mark.parametrize(
    ("start", "state_at_step_1", "flushed_before_step_1"),
    [(TRAINING_LOOP, 0, False), (PROBE, 1, True)],
)
def test_a_measured_loop_starts_as_a_training_script_or_as_a_probe(
    start, state_at_step_1, flushed_before_step_1
):
    # The loop a user writes: the model built on the GPU, no flush, the optimizer's state made
    # by step 1's optimizer step. A probe: state primed, the cache emptied right before step 1.
    calls: list[str] = []

    class Recording(FakeCuda):
        def empty_cache(self):
            calls.append("empty_cache")

        def reset_peak_memory_stats(self):
            calls.append("reset_peak")

    class Step(CatalogStep):
        def build_model(self, **kwargs):
            calls.append("build")
            return super().build_model(**kwargs)

        def run_step(self, model, optimizer, *args, **kwargs):
            calls.append(f"step with {len(optimizer.state) and 1} state")
            return super().run_step(model, optimizer, *args, **kwargs)

    cuda = Recording()
    settings = Settings(model="tiny-bert", seq_len=16, precision="16-mixed")
    backend = DeviceBackend(
        Step(settings),
        policy=FitPolicy(capacity_bytes=BIG),
        name="cpu",
        device_module=cuda,
        peak_stats=True,
    )
    loop = measured_loop(backend, 2, 2, cuda, start)
    assert loop.runs and loop.start == start.name
    first = calls.index("reset_peak")
    assert calls[first + 1] == f"step with {state_at_step_1} state"
    assert calls[calls.index("reset_peak", first + 1) + 1] == "step with 1 state"
    assert (calls[first - 1] == "empty_cache") is flushed_before_step_1
    assert "build" in calls[:first]


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
    # A loop's figures step by step: one space-separated cell, a list in the JSON twin.
    assert split_cell(record["predicted_reserved_per_step"]) == rows[0].predicted_reserved_per_step
    assert len(record["measured_retries_per_step"].split()) == LOOP_STEPS
    assert (record["measured_oom_step"], record["predicted_retries"]) == ("", "0")
    (twin,) = json.loads(json_path.read_text())
    assert twin == rows[0].to_dict() and twin["seq_len"] is None
    assert twin["measured_reserved_per_step"] == list(rows[0].measured_reserved_per_step)


def test_file_names_say_the_gpu_the_emulated_gpu_and_the_day():
    assert file_stem("NVIDIA A100-SXM4-80GB", "", DAY) == "nvidia-a100-sxm4-80gb-2026-05-10"
    assert (
        file_stem("NVIDIA H100 80GB HBM3", "A10G", DAY)
        == "nvidia-h100-80gb-hbm3-as-a10g-2026-05-10"
    )


class CappedDevice:
    """A GPU whose step reserves `cap * batch / full_at` bytes and runs out of memory past the
    cap the fake cuda module was given (the allocator under a memory fraction); from batch
    `later_steps_fail_from` on, each step after the first runs out of memory (a first step that
    squeezed through after a cache flush). What a loop reads of a backend, and nothing more."""

    measured, device = True, "cuda"
    _model = _optimizer = None

    def __init__(
        self, cuda: FakeCuda, full_at: float, gpu, later_steps_fail_from: int | None = None
    ) -> None:
        self.cuda, self.full_at, self.later_from = cuda, full_at, later_steps_fail_from
        self.policy = FitPolicy(capacity_bytes=gpu.usable_bytes)
        self.training_step = self
        self.steps = 0

    def resident_bytes(self):
        self.steps = 0  # a probe's loop starts
        return {}

    def release(self):
        pass

    def fresh_loop(self):
        self.steps = 0  # a training loop starts
        return None, None

    def run_step(self, model, optimizer, batch_size, device):
        self.steps += 1
        reserved = int(self.cuda.cap_bytes * batch_size / self.full_at)
        later_fails = self.later_from is not None and batch_size >= self.later_from
        if reserved > self.cuda.cap_bytes or (later_fails and self.steps > 1):
            self.cuda.counters["num_ooms"] += 1
            raise torch.OutOfMemoryError("CUDA out of memory.")
        self.cuda.peaks = (reserved * 9 // 10, reserved)

    @contextlib.contextmanager
    def session(self):
        yield self


def test_emulation_caps_the_allocator_at_the_gpus_capacity_and_checks_the_predicted_boundary():
    # GPT-2 at seq 128 on a T4 (step 8): the batch the simulation recommends must fit, the
    # largest it says runs must run, and one step more must not.
    cuda = FakeCuda()
    t4 = find_gpu("T4")
    grid = settings_grid(["gpt2"], protocols=["full"])
    max_batch, step, recommended = calibration.predicted_boundary(grid[0], t4)
    # Under the training loop the engine recommends its largest running batch here (56 of
    # 56); a recommendation one step below puts the recommended row in the checks.
    recommended = min(recommended, max_batch - step)
    rows = list(
        calibrate(
            grid,
            (8,),
            emulate=t4,
            cuda=cuda,
            real=lambda settings, gpu: CappedDevice(cuda, max_batch + step / 2, gpu),
            boundary=lambda settings, gpu: (max_batch, step, recommended),
            nvml=NVML,
        )
    )
    # The fraction is of the total cudaMemGetInfo reports, and it is lifted at the end.
    assert cuda.fractions == [(t4.usable_bytes / A10_TOTAL, 0), (1.0, 0)]
    assert [(r.batch_size, r.boundary_check) for r in rows] == [
        (8, ""),
        *boundary_checks(max_batch, step, recommended),
    ]
    assert {(r.environment.emulated_gpu, r.capacity_bytes) for r in rows} == {
        ("T4", t4.usable_bytes)
    }
    _, at_recommended, at_max, past_max = rows
    assert (at_recommended.measured_fits, at_recommended.predicted_fits) == (True, True)
    assert (at_max.measured_fits, at_max.predicted_fits, at_max.verdict_agrees) == (True,) * 3
    capped_bytes = int(cuda.fractions[0][0] * A10_TOTAL)
    assert at_max.measured_reserved_bytes == int(capped_bytes * max_batch / (max_batch + step / 2))
    assert at_max.predicted_reserved_bytes <= t4.usable_bytes
    assert (past_max.measured_fits, past_max.predicted_fits, past_max.verdict_agrees) == (
        False,
        False,
        True,
    )
    assert (past_max.num_ooms, past_max.measured_reserved_bytes) == (1, None)
    assert past_max.predicted_reserved_bytes > at_max.predicted_reserved_bytes


def test_the_simulation_of_a_capped_run_has_the_devices_kernels_at_the_emulated_capacity():
    h100, a10 = find_gpu("H100 80GB"), find_gpu("A10")
    gpu = as_run(h100, a10.usable_bytes, "A10")
    assert (gpu.usable_bytes, gpu.compute_capability) == (a10.usable_bytes, (9, 0))
    assert gpu.name == "H100 80GB as A10"
    assert as_run(h100, h100.usable_bytes) is h100


def test_a_loop_whose_later_step_runs_out_keeps_its_first_steps_bytes_and_says_which_step():
    cuda = FakeCuda()
    rows = list(
        calibrate(
            settings_grid(["tiny-gpt2"], protocols=["full"], seq_len=16),
            (10, 30),
            cuda=cuda,
            real=lambda settings, gpu: CappedDevice(cuda, 100, gpu, later_steps_fail_from=30),
            nvml=NVML,
        )
    )
    fine, second_fails = rows
    reserved = int(A10_TOTAL * 30 / 100)
    assert (second_fails.measured_allocated_bytes, second_fails.measured_reserved_bytes) == (
        reserved * 9 // 10,
        reserved,
    )
    assert (second_fails.measured_oom_step, second_fails.measured_fits) == (2, False)
    assert second_fails.measured_reserved_per_step == (reserved,)
    assert second_fails.measured_retries_per_step == (0, 0) and second_fails.num_ooms == 1
    assert second_fails.reserved_error is not None  # comparable: not lost with the verdict
    assert (fine.measured_oom_step, fine.measured_fits, len(fine.measured_reserved_per_step)) == (
        None,
        True,
        LOOP_STEPS,
    )


def test_a_replay_fills_a_steady_loop_to_the_steps_asked_and_stops_at_its_oom():
    steady = Prediction(
        10,
        20,
        reserved_per_step=(18, 20),
        allocated_per_step=(9, 10),
        retries_per_step=(1, 0),
        steps=2,
    )
    figures = [
        (s.step, s.allocated_bytes, s.reserved_bytes, s.retries, s.oom)
        for s in replayed_steps(steady, 4)
    ]
    assert figures == [
        (1, 9, 18, 1, False),
        (2, 10, 20, 0, False),
        (3, 10, 20, 0, False),  # steady: each later step replays as the last
        (4, 10, 20, 0, False),
    ]
    dies = Prediction(
        10,
        30,
        out_of_memory=True,
        reserved_per_step=(18,),
        allocated_per_step=(9,),
        retries_per_step=(1, 2),
        steps=2,
    )
    assert [(s.step, s.reserved_bytes, s.retries, s.oom) for s in replayed_steps(dies, 4)] == [
        (1, 18, 1, False),
        (2, None, 2, True),
    ]
    assert len(replayed_steps(steady, 1)) == 1


def test_a_boundary_the_gpu_disagrees_with_is_reported_as_such():
    cuda = FakeCuda()
    rows = list(
        calibrate(
            settings_grid(["tiny-gpt2"], protocols=["full"], seq_len=16),
            (),
            emulate=find_gpu("T4"),
            cuda=cuda,
            real=lambda settings, gpu: CappedDevice(cuda, 50, gpu),  # OOMs from batch 51
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
            real=lambda settings, gpu: CappedDevice(cuda, 1000, gpu),
            on_skip=lambda s, why: skipped.append((s.workload.model, why)),
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
    assert Settings(model="bert").search.margin == RECOMMENDED_MARGIN


def test_the_readmes_accuracy_tables_are_the_committed_calibration_data():
    """The README's accuracy summary, the accuracy page and docs/calibration's README show what
    `calibration_table.py --summary` prints from docs/calibration."""
    table_lines = [line for line in summary().splitlines() if line.startswith("|")]
    assert len(table_lines) > 3  # the header, its rule, at least one GPU and "all"
    docs = ROOT / "docs"
    for readme in (ROOT / "README.md", docs / "accuracy.md", docs / "calibration" / "README.md"):
        text = readme.read_text()
        assert all(line in text for line in table_lines), readme
