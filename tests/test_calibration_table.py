"""The evidence re-read: committed calibration rows and steady-state lines become the runs they
were, re-simulated like for like (`calibration_table.py --repredict`), and steady_state.py writes
the simulation's steps beside the GPU's. Tiny models; the GPU is a fake `torch.cuda` module."""

import contextlib
import csv
import datetime
import json
from types import SimpleNamespace

import pytest
import torch

from benchmarks.calibration_table import evidence, repredicted, select
from benchmarks.steady_state import steady_state
from memorymark.accounting.allocator import TRAINING_LOOP
from memorymark.calibration.evidence import from_steady_state
from memorymark.calibration.record import COLUMNS, LOOP_COLUMNS, CalibrationRow, write
from memorymark.calibration.repredict import (
    BOUNDARY_DEFINITION,
    recommended_with_retries,
    repredict,
)
from memorymark.environment import GpuEnvironment
from memorymark.fit import FitPolicy
from memorymark.gpus import find_gpu
from memorymark.settings import Settings
from memorymark.units import GIB

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

H100 = find_gpu("H100 80GB")
H100_TOTAL = 85017493504  # as the committed rows' device reported it
DAY = datetime.date(2026, 1, 1)
ENV = GpuEnvironment(
    gpu_name="NVIDIA H100 80GB HBM3",
    gpu_total_bytes=H100_TOTAL,
    emulated_gpu="",
    torch_version="2.11.0+cu130",
    cuda_version="13.0",
    driver_version="",
    memorymark_version="0.1.0",
    git_commit="",
)


def row(**changes) -> CalibrationRow:
    """A tiny-bert row measured on the H100, uncapped, that ran."""
    fields = dict(
        environment=ENV,
        model="tiny-bert",
        task="sequence-classification",
        precision="32-true",
        optimizer="adamw",
        grad_checkpointing=False,
        lora_rank=0,
        protocol="full",
        seq_len=16,
        image_size=None,
        batch_size=2,
        grad_accum=1,
        capacity_bytes=H100_TOTAL - H100.context_bytes,
        measured_allocated_bytes=60 * 2**20,
        measured_reserved_bytes=64 * 2**20,
        measured_fits=True,
        alloc_retries=0,
        num_ooms=0,
        predicted_allocated_bytes=0,
        predicted_reserved_bytes=0,
        predicted_fits=True,
    )
    return CalibrationRow(**{**fields, **changes})


def test_a_committed_row_reads_back_as_the_run_it_was(tmp_path):
    capped = GpuEnvironment(**{**ENV.to_dict(), "emulated_gpu": "A10"})
    a10 = find_gpu("A10")
    write(
        [
            row(
                environment=capped,
                protocol="inference-style",
                optimizer="none",
                boundary_check="max fits",
                capacity_bytes=a10.usable_bytes,
                alloc_retries=2,
                loop_steps=3,
                measured_oom_step=2,
                measured_allocated_per_step=(100,),
                measured_reserved_per_step=(200,),
                measured_retries_per_step=(2, 0),
            )
        ],
        tmp_path,
    )
    (ev,) = evidence(tmp_path)
    assert (
        ev.label
        == "H100 80GB as A10, tiny-bert, inference-style 32-true none, seq 16, batch 2 (max fits)"
    )
    assert (
        ev.settings.workload.protocol,
        ev.settings.workload.seq_len,
        ev.settings.search.margin,
    ) == (
        "inference-style",
        16,
        "2%",
    )
    assert (ev.device_gpu.compute_capability, ev.capacity_bytes, ev.capped_as) == (
        (9, 0),
        a10.usable_bytes,
        "A10",
    )
    assert (ev.verdict_steps, ev.byte_steps, ev.measured_retries) == (3, 3, 2)
    assert ev.torch_version == "2.11.0+cu130"
    assert [(s.step, s.reserved_bytes, s.retries, s.oom) for s in ev.measured_steps] == [
        (1, 200, 2, False),
        (2, None, 0, True),
    ]


def test_a_row_written_before_loops_were_measured_compares_first_steps(tmp_path):
    old = [c for c in COLUMNS if c not in LOOP_COLUMNS]
    with (tmp_path / "old.csv").open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=old)
        writer.writeheader()
        record = row(
            model="tiny-resnet", task="image-classification", seq_len=None, image_size=32
        ).to_dict()
        writer.writerow({k: "" if record[k] is None else record[k] for k in old})
    (ev,) = evidence(tmp_path)
    # The probe ran five steps for its verdict; its bytes were the first step's.
    assert (ev.verdict_steps, ev.byte_steps, ev.measured_steps) == (5, 1, ())
    assert ev.settings.workload.image_size == 32 and ev.label.endswith(", 32px, batch 2")


def test_a_steady_state_line_in_gib_names_its_gpu_in_the_file_name():
    line = {
        "model": "gpt2",
        "precision": "bf16-mixed",
        "gpu": "A10",
        "capacity_gib": 21.6797,
        "batch": 112,
        "real": [
            {
                "step": 1,
                "oom": False,
                "allocated_gib": 20.4347,
                "reserved_gib": 20.6523,
                "retries": 1,
            },
            {
                "step": 2,
                "oom": True,
                "allocated_gib": 19.1263,
                "reserved_gib": 20.6523,
                "retries": 1,
            },
        ],
    }
    ev = from_steady_state(line, "steady-state-nvidia-h100-80gb-hbm3-2026-11-23.jsonl")
    assert ev.device_gpu.name == "H100 80GB" and ev.capacity_bytes == find_gpu("A10").usable_bytes
    # Its second step ran out of memory: the first step's bytes stay, the verdict is OOM; the
    # loop asked for four steps, the script's default then.
    verdict = (ev.measured_runs, ev.measured_retries, ev.byte_steps, ev.verdict_steps)
    assert verdict == (False, 2, 1, 4)
    assert ev.measured_reserved_bytes == round(20.6523 * GIB)
    assert (
        ev.label
        == "H100 80GB as A10, gpt2, full bf16-mixed adamw, seq 128, batch 112 (steady state)"
    )
    with pytest.raises(ValueError, match="no device_gpu"):
        from_steady_state(line, "loop.jsonl")


def test_only_keeps_the_rows_judged_against_a_gpu_or_from_a_file():
    def ev(source, capped_as=""):
        return SimpleNamespace(source=source, capped_as=capped_as, device_gpu=H100)

    rows = [
        ev("as-a10.csv", "A10"),
        ev("as-a100.csv", "A100 40GB"),
        ev("h100.csv"),
        ev("steady-state-h100.jsonl"),
    ]
    assert select(rows, ["a10"]) == rows[:1]  # not the A100 40GB's
    assert select(rows, ["a10", "steady-state"]) == [rows[0], rows[3]]
    assert select(rows, ["h100"]) == [rows[2], rows[3]]
    assert select(rows, limit=2) == rows[:2]


def test_repredict_counts_boundary_rows_apart_and_lists_disagreements_and_retried_recommendations(
    tmp_path,
):
    # What tiny-bert needs at batch 2 on the H100 today, read from the engine itself.
    write([row()], tmp_path, DAY)
    (roomy,) = repredict(evidence(tmp_path))
    assert roomy.error is None and roomy.agrees and not roomy.near_capacity
    assert roomy.allocated_error == pytest.approx(
        (roomy.allocated_bytes - 60 * 2**20) / (60 * 2**20)
    )
    need = roomy.reserved_bytes
    tight = need * 21 // 20  # the need is 95% of this capacity
    write(  # the same GPU and day: the file is replaced
        [
            row(alloc_retries=3),  # far below capacity, needed retries: recommended anyway
            row(capacity_bytes=tight),  # near capacity: a boundary row, agreeing
            row(capacity_bytes=tight, batch_size=4096),  # re-predicted OOM, measured runs
        ],
        tmp_path,
        DAY,
    )
    results = list(repredict(evidence(tmp_path)))
    assert [(r.near_capacity, r.runs, r.agrees) for r in results] == [
        (False, True, True),
        (True, True, True),
        (True, False, False),
    ]
    assert recommended_with_retries(results) == [results[0]]
    text = repredicted(results, 12.0).splitlines()
    assert text[0].startswith("Re-predicted 3 of 3 rows with the current engine in 12 s")
    assert text[4].startswith("| boundary | 2 |") and text[4].endswith("| 1 of 2 |")
    assert text[5].startswith("| far below capacity | 1 |") and text[5].endswith("| 1 of 1 |")
    assert text[6].endswith("| 2 of 3 |")
    assert f"Definition: {BOUNDARY_DEFINITION}." in text
    i = text.index("Verdicts that disagree: 1")
    assert text[i + 1] == (
        "- H100 80GB, tiny-bert, full 32-true adamw, seq 16, batch 4096: DISAGREE: measured "
        "runs, re-predicted OOM at step 1"
    )
    i = text.index("Recommended batches that needed a retry on the GPU: 1")
    assert text[i + 1].startswith(
        "- H100 80GB, tiny-bert, full 32-true adamw, seq 16, batch 2: 3 retries on the GPU"
    )


def test_a_row_is_replayed_with_the_cublas_workspaces_of_the_torch_it_ran(tmp_path):
    # Under torch 2.9 to 2.11 each thread also keeps a cuBLASLt workspace (gpus/workspaces.py).
    older = GpuEnvironment(**{**ENV.to_dict(), "torch_version": "2.11.0+cu130"})
    newer = GpuEnvironment(**{**ENV.to_dict(), "torch_version": "2.13.0+cu130"})
    write([row(environment=older), row(environment=newer)], tmp_path, DAY)
    on_211, on_213 = repredict(evidence(tmp_path))
    assert on_211.allocated_bytes > on_213.allocated_bytes


# -- benchmarks/steady_state.py ------------------------------------------------------------------
class FakeCuda:
    """An H100 whose peaks the fake step sets."""

    def __init__(self):
        self.peaks, self.counters = (0, 0), {"num_alloc_retries": 0, "num_ooms": 0}

    def get_device_properties(self, index):
        return SimpleNamespace(
            name="NVIDIA H100 80GB HBM3", total_memory=H100_TOTAL, major=9, minor=0
        )

    def memory_stats(self):
        allocated, reserved = self.peaks
        return {
            "allocated_bytes.all.peak": allocated,
            "reserved_bytes.all.peak": reserved,
            **self.counters,
        }

    def reset_peak_memory_stats(self):
        pass

    def synchronize(self):
        pass

    def empty_cache(self):
        pass


class Device:
    """The GPU side of a loop: each step reserves `batch` MiB; from batch 100 the second step
    runs out of memory."""

    measured, device, _model, _optimizer = True, "cuda", None, None

    def __init__(self, cuda, gpu):
        self.cuda, self.training_step, self.steps = cuda, self, 0
        self.policy = FitPolicy(capacity_bytes=gpu.usable_bytes)

    def resident_bytes(self):
        return {}

    def release(self):
        pass

    def fresh_loop(self):  # a training loop starts
        return None, None

    def run_step(self, model, optimizer, batch_size, device):
        self.steps += 1
        if batch_size >= 100 and self.steps == 2:
            raise torch.OutOfMemoryError("CUDA out of memory.")
        self.cuda.peaks = (batch_size * 2**20 - 4096, batch_size * 2**20)

    @contextlib.contextmanager
    def session(self):
        yield self


def test_steady_state_writes_each_real_step_beside_the_replayed_one():
    cuda = FakeCuda()
    settings = Settings(model="tiny-gpt2", seq_len=16, margin="0%")
    lines = list(
        steady_state(settings, (8, 100), 3, cuda=cuda, real=lambda s, gpu: Device(cuda, gpu))
    )
    fine, second_fails = lines
    assert (fine["device_gpu"], fine["gpu"], fine["capacity_bytes"]) == (
        "H100 80GB",
        "H100 80GB",
        H100_TOTAL - H100.context_bytes,
    )
    assert [s["reserved_bytes"] for s in fine["real"]] == [8 * 2**20] * 3
    assert fine["torch_version"] == torch.__version__  # the workspaces a re-prediction replays
    assert [s["step"] for s in fine["predicted"]] == [1, 2, 3]
    assert all(s["reserved_bytes"] > s["allocated_bytes"] > 0 for s in fine["predicted"])
    # The step that ran out keeps the peak it reached; step 1's bytes are the loop's.
    assert [(s["step"], s["oom"], s["reserved_bytes"]) for s in second_fails["real"]] == [
        (1, False, 100 * 2**20),
        (2, True, 100 * 2**20),
    ]
    assert second_fails["real_loop"] == {
        "runs": False,
        "oom_step": 2,
        "retries": 0,
        "allocated_bytes": 100 * 2**20 - 4096,
        "reserved_bytes": 100 * 2**20,
    }
    assert second_fails["predicted_loop"]["runs"] is True
    assert json.loads(json.dumps(second_fails)) == second_fails  # one JSON object per line
    # And --repredict reads the line back as the run it was.
    ev = from_steady_state(second_fails, "loop.jsonl")
    assert (ev.measured_runs, ev.measured_reserved_bytes, ev.device_gpu.name) == (
        False,
        100 * 2**20,
        "H100 80GB",
    )


def test_each_row_is_replayed_started_as_it_ran_or_as_asked(tmp_path):
    # Rows written before the column ran as probes (state primed, the cache emptied first);
    # a row that says so ran as a training loop. Each is replayed the same way, unless asked.
    write([row(), row(loop_start=TRAINING_LOOP.name)], tmp_path, DAY)
    probe_row, loop_row = evidence(tmp_path)
    assert (probe_row.loop_start, loop_row.loop_start) == ("probe", "training loop")
    as_ran = list(repredict([probe_row, loop_row]))
    assert [r.loop.start for r in as_ran] == ["probe", "training loop"]
    asked = list(repredict([probe_row, loop_row], start=TRAINING_LOOP))
    assert [r.loop.start for r in asked] == ["training loop"] * 2
    assert asked[0].reserved_bytes == as_ran[1].reserved_bytes
