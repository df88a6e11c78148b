"""Calibration: rows pair a simulated and a real measurement; without a GPU it says so."""

import csv
import json
import subprocess
import sys
from pathlib import Path

from memorymark.calibrate import calibrate, write
from memorymark.devices import CpuBackend
from memorymark.sim import SimBackend
from memorymark.workload import Workload

ROOT = Path(__file__).resolve().parents[1]
BIG = 8 * 2**30


def test_rows_compare_simulation_with_a_real_run(tmp_path):
    # The real CPU backend stands in for CUDA: same tracker and, with the CUDA rules off, the
    # same kernels, so the error must be zero.
    rows = list(
        calibrate(
            ("tiny-bert",),
            (2, 4),
            real=lambda s: CpuBackend(Workload(s), capacity_bytes=BIG),
            simulated=lambda s: SimBackend(Workload(s), capacity_bytes=BIG, cuda_rules=False),
        )
    )
    assert [(r.protocol, r.batch_size) for r in rows] == [
        ("full", 2),
        ("full", 4),
        ("inference-style", 2),
        ("inference-style", 4),
    ]
    assert all(r.allocated_error == 0.0 for r in rows)
    full, inference = rows[1], rows[3]
    assert inference.measured_allocated_bytes < full.measured_allocated_bytes
    json_path, csv_path = write(rows, tmp_path)
    assert len(json.loads(json_path.read_text())) == 4
    with csv_path.open() as f:
        records = list(csv.DictReader(f))
    assert records[0]["model"] == "tiny-bert" and records[0]["allocated_error"] == "0.0"


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
