"""The real-GPU evidence run (`make gpu-evidence`): dry on CPU it walks every chunk's code and
writes every file a GPU run writes, each marked dry; the ballast that caps what
`cudaMemGetInfo` reports; the driver's budget; the README tables regenerated from the files."""

import csv
import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import gpu_evidence
from benchmarks.calibration_table import DryRunError, _gpu, calibration_files, load
from benchmarks.evidence import peers
from benchmarks.evidence.device import DryCuda, DryRuntime
from benchmarks.evidence.plan import DRY
from benchmarks.evidence.summary import NONE_YET, write_readmes
from memorymark.calibration import ballast
from memorymark.calibration.record import COLUMNS
from memorymark.calibration.run import capped
from memorymark.gpus import custom_gpu, detected_gpu

ROOT = Path(__file__).resolve().parents[1]
GIB = 2**30


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """One `make gpu-evidence DRY=1` (about a minute on 2 cores), shared by the tests below."""
    out = tmp_path_factory.mktemp("evidence")
    bundle = out / "back" / "evidence.tar.gz"
    command = ["make", "-s", "gpu-evidence", f"OUT={out}", "DRY=1", f"BUNDLE={bundle}"]
    done = subprocess.run(
        [*command, f"EVIDENCE_PYTHON={sys.executable}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, bundle


def _csv(path):
    with path.open(newline="") as f:
        return list(csv.reader(f))


def _dicts(*paths):
    rows = []
    for path in paths:
        with path.open(newline="") as f:
            rows += list(csv.DictReader(f))
    return rows


def test_a_dry_run_writes_every_file_a_gpu_run_writes_each_marked_dry(dry_run):
    out, bundle = dry_run
    folder = out / "calibration"
    names = sorted(p.name for p in folder.iterdir())
    day = json.loads(next(folder.glob("evidence-*.json")).read_text())["day"]
    stem = f"dry-run-simulated-h100-{day}"
    expected = [f"evidence-{stem}.json", f"loops-{stem}.jsonl", f"peers-{stem}.csv"]
    expected += [f"smoke-{stem}.json", f"{stem}-quantized.csv", f"{stem}-quantized.json"]
    expected += [f"{stem}-compiled.csv", f"{stem}-compiled.json"]
    # One file pair per capacity and cap, and the boundary's at its capacity.
    capped = f"dry-run-simulated-h100-as-dry-0-5-gib-{day}"
    for suffix in ("capped-ballast", "capped-fraction", "quantized"):
        expected += [f"{capped}-{suffix}.{ext}" for ext in ("csv", "json")]
    assert names == sorted(expected)
    assert all("dry-run" in name for name in names)
    # The bundle is the folder, for a device call that returns few files.
    with tarfile.open(bundle) as tar:
        packed = {m.name for m in tar.getmembers() if m.isfile()}
    assert {f"calibration/{n}" for n in names} <= packed
    assert "logs/loops.log" in packed


def test_the_manifest_says_what_ran_in_priority_order(dry_run):
    out, _ = dry_run
    manifest = json.loads(next((out / "calibration").glob("evidence-*.json")).read_text())
    chunks = manifest["chunks"]
    assert list(chunks) == ["smoke", "compiled", "capped", "quantized", "loops", "peers"]
    assert {n: c["status"] for n, c in chunks.items()} == dict.fromkeys(chunks, "ok")
    assert manifest["dry_run"] is True
    # Inductor's CPU build is too slow for a dry run: the compiled row is simulated, and says so.
    assert any("Inductor" in n for n in chunks["compiled"]["notes"])
    # Where a step needs CUDA, the dry run's measured side is the simulation, and says so.
    assert any("nf4 kernels need CUDA" in n for n in chunks["quantized"]["notes"])


def test_calibration_files_keep_the_contract_with_the_cap_and_quantization_columns(dry_run):
    out, _ = dry_run
    folder = out / "calibration"
    for path in folder.glob("*.csv"):
        if not path.name.startswith("peers-"):
            assert tuple(_csv(path)[0]) == COLUMNS, path.name
    rows = _dicts(*sorted(folder.glob("*capped*.csv")))
    assert sorted({(r["cap_method"], r["emulated_gpu"]) for r in rows}) == [
        ("ballast", "dry 0.5 GiB"),
        ("fraction", "dry 0.5 GiB"),
    ]
    # Re-run as the committed rows ran: probes, the batch asked, no boundary rows.
    assert {(r["loop_start"], r["batch_size"], r["boundary_check"]) for r in rows} == {
        ("probe", "4", "")
    }
    uncapped = _dicts(next(folder.glob("dry-run-simulated-h100-2*-quantized.csv")))
    assert [(r["quantization"], r["optimizer"], r["kernels"]) for r in uncapped] == [
        ("nf4 double-quant", "adamw", ""),
        ("none", "paged-adamw-8bit", ""),
        ("none", "adamw", "liger"),
    ]
    assert all(r["gpu_name"] == "DRY RUN simulated H100" for r in rows + uncapped)
    compiled = _dicts(next(folder.glob("dry-run-simulated-h100-2*-compiled.csv")))
    assert [(r["model"], r["compile"], r["float8"]) for r in compiled] == [
        ("tiny-llama", "false", "none"),
        ("tiny-llama", "true", "none"),
    ]
    # Both simulated: a tiny model's compiled step may hold a block more or less than eager.
    assert all(int(r["predicted_allocated_bytes"]) > 0 for r in compiled)
    edge = _dicts(next(folder.glob("*-as-dry-0-5-gib-*-quantized.csv")))
    assert [r["boundary_check"] for r in edge][-2:] == ["max fits", "max+step OOM"]
    # The measured side is the simulation of the same device here: the verdicts agree.
    assert all(r["verdict_agrees"] == "true" for r in edge)


def test_each_loop_is_logged_step_by_step_beside_the_replay(dry_run):
    out, _ = dry_run
    path = next((out / "calibration").glob("loops-*.jsonl"))
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    heads = [line for line in lines if line["kind"] == "loop"]
    assert [(h["model"], h["emulated_gpu"]) for h in heads] == [
        ("tiny-gpt2", "dry 0.5 GiB"),
        ("tiny-gpt2", "dry 0.6 GiB"),
    ]
    assert all(h["batch_size"] > 0 and h["dry_run"] for h in heads)
    for head in heads:
        steps = [
            (line["kind"], line["step"])
            for line in lines
            if line["kind"] != "loop" and line["emulated_gpu"] == head["emulated_gpu"]
        ]
        # Four training steps, the evaluation pass after steps 2 and 4.
        assert steps == [
            ("train", 1),
            ("train", 2),
            ("eval", 2),
            ("train", 3),
            ("train", 4),
            ("eval", 4),
        ]
    step = next(line for line in lines if line["kind"] == "train")
    assert step["predicted_reserved_bytes"] > 0 and step["oom"] is False
    assert step["measured_reserved_bytes"] == 0  # the dry device measures nothing


def test_the_peers_finders_search_for_real_against_the_simulated_limit(dry_run):
    out, _ = dry_run
    path = next((out / "calibration").glob("peers-*.csv"))
    header, *body = _csv(path)
    assert tuple(header) == peers.COLUMNS
    rows = {r["tool"]: r for r in _dicts(path)}
    limit = int(rows["memorymark (simulated, max)"]["answer_batch"])
    lightning = rows["lightning BatchSizeFinder (binsearch)"]
    accelerate = rows[f"accelerate find_executable_batch_size (from {DRY.peers_accelerate_start})"]
    for finder in (lightning, accelerate):
        assert 0 < int(finder["answer_batch"]) <= limit
        assert int(finder["trials"]) > 1 and finder["survived"] == "true"
    assert len(body) == 4 and all(r["dry_run"] == "true" for r in rows.values())


def test_a_folder_with_a_dry_run_is_refused_by_the_accuracy_tables(dry_run):
    out, _ = dry_run
    with pytest.raises(DryRunError, match="no measurements"):
        load(out / "calibration")
    done = subprocess.run(
        [sys.executable, "benchmarks/calibration_table.py", "--dir", str(out / "calibration")],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2 and "dry run" in done.stderr


def test_the_evidence_section_is_written_from_the_files(dry_run, tmp_path):
    out, _ = dry_run
    for name in ("README.md", "docs/accuracy.md", "docs/calibration/README.md"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / name, tmp_path / name)
    from benchmarks.calibration_table import summary

    changed = write_readmes(out / "calibration", summary(), root=tmp_path)
    assert changed == [tmp_path / "docs" / "calibration" / "README.md"]
    text = changed[0].read_text()
    assert NONE_YET not in text
    assert "| dry 0.5 GiB | tiny-resnet | 32-true | 4 | 0 0 [runs] | 0 0 [runs] |" in text
    assert "| DRY RUN simulated H100 | dry 0.5 GiB | tiny-gpt2 |" in text
    assert "lightning BatchSizeFinder (binsearch)" in text
    # The committed READMEs show what --write makes of docs/calibration (no evidence run yet).
    for name in ("README.md", "docs/accuracy.md"):
        assert (tmp_path / name).read_text() == (ROOT / name).read_text()


# -- the ballast ------------------------------------------------------------------------------
class FakeRuntime:
    def __init__(self, free, fail_at=None):
        self.free_bytes, self.fail_at, self.calls = free, fail_at, []

    def mem_get_info(self):
        return self.free_bytes, 80 * GIB

    def malloc(self, nbytes):
        if self.fail_at is not None and len(self.calls) == self.fail_at:
            raise MemoryError("cudaMalloc failed with cudaError 2")
        self.calls.append(("malloc", nbytes))
        self.free_bytes -= nbytes
        return len(self.calls)

    def free(self, pointer):
        self.calls.append(("free", pointer))


def test_the_ballast_leaves_the_capacity_and_the_drivers_page_free_in_1_gib_pieces():
    assert ballast.ballast_bytes(10 * GIB, 4 * GIB) == 6 * GIB - ballast.SLACK_BYTES
    assert ballast.pieces(int(2.5 * GIB)) == [GIB, GIB, GIB // 2]
    runtime = FakeRuntime(10 * GIB)
    with ballast.held(runtime, 4 * GIB) as held:
        assert held == 6 * GIB - ballast.SLACK_BYTES
        assert runtime.free_bytes == 4 * GIB + ballast.SLACK_BYTES
    assert [c[0] for c in runtime.calls] == ["malloc"] * 6 + ["free"] * 6
    with pytest.raises(ValueError, match="a ballast can only shrink a GPU"):
        ballast.ballast_bytes(GIB, 2 * GIB)


def test_pieces_taken_are_given_back_when_a_later_one_fails():
    runtime = FakeRuntime(10 * GIB, fail_at=2)
    with pytest.raises(MemoryError, match="cudaMalloc failed"):
        with ballast.held(runtime, GIB):
            pass
    assert runtime.calls == [("malloc", GIB), ("malloc", GIB), ("free", 2), ("free", 1)]


def test_a_ballast_cap_lowers_what_cudaMemGetInfo_reports_and_lifts_it_after():
    cuda = DryCuda(total_bytes=8 * GIB)
    device = detected_gpu("DRY RUN simulated H100", 8 * GIB, (9, 0))
    small = custom_gpu(2, name="small")
    with capped(cuda, small, device, "ballast", DryRuntime(cuda)):
        assert cuda.mem_get_info()[0] == small.usable_bytes + ballast.SLACK_BYTES
        assert cuda.fractions == []  # the allocator itself is not capped
    assert cuda.mem_get_info()[0] == 8 * GIB
    with pytest.raises(ValueError, match="cap must be one of fraction, ballast"):
        with capped(cuda, small, device, "both"):
            pass


def test_libcudart_is_the_one_torch_mapped(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text(
        "7f00-7f01 r-xp 0 08:01 1 /usr/lib/libc.so.6\n"
        "7f02-7f03 r-xp 0 08:01 2 /site/nvidia/cu13/lib/libcudart.so.13\n"
    )
    assert ballast.find_cudart(str(maps)) == "/site/nvidia/cu13/lib/libcudart.so.13"


# -- the driver and the tables ---------------------------------------------------------------
def test_no_chunk_starts_once_the_budget_is_spent(tmp_path):
    assert gpu_evidence.run_all(tmp_path, True, 10, None, None, gpu_evidence._today()) == 0
    manifest = json.loads(next((tmp_path / "calibration").glob("evidence-*.json")).read_text())
    whys = {n: c.get("why", "") for n, c in manifest["chunks"].items()}
    assert all(whys[n].startswith("budget spent") for n in ("smoke", "loops", "peers"))
    assert gpu_evidence.main(["--out", str(tmp_path), "--chunks", "everything"]) == 2


def test_the_summary_groups_rows_by_quantization_kernels_and_ballast(tmp_path):
    row = {"gpu_name": "NVIDIA H100 80GB HBM3", "emulated_gpu": "A10", "optimizer": "adamw"}
    assert _gpu(row) == "NVIDIA H100 80GB HBM3 as A10"  # a file from before the columns
    assert (
        _gpu({**row, "cap_method": "ballast"})
        == "NVIDIA H100 80GB HBM3 as A10 (cudaMalloc ballast)"
    )
    quantized = {**row, "emulated_gpu": "", "quantization": "nf4 double-quant", "kernels": "liger"}
    assert _gpu(quantized) == "NVIDIA H100 80GB HBM3, nf4 double-quant, liger"
    paged = {**row, "emulated_gpu": "", "optimizer": "paged-adamw-8bit"}
    assert _gpu(paged) == "NVIDIA H100 80GB HBM3, paged-adamw-8bit"
    (tmp_path / "peers-x.csv").write_text("gpu_name,tool\nH100,lightning\n")
    shutil.copy(ROOT / "docs/calibration/nvidia-h100-80gb-hbm3-as-a10-2026-11-23.csv", tmp_path)
    assert [p.name for p in calibration_files(tmp_path)] == [
        "nvidia-h100-80gb-hbm3-as-a10-2026-11-23.csv"
    ]


def test_a_finder_that_fails_is_a_row_saying_how_not_the_end_of_the_chunk():
    def broken_finder(job, plan, device):
        raise RuntimeError("scale_batch_size() got an unexpected keyword argument")

    device = SimpleNamespace(cuda=DryCuda())
    answer = peers._found(broken_finder, peers.Job(DRY, None), DRY, device)
    assert answer[:5] == ("broken", "", 0, 0, 0.0)
    assert "unexpected keyword argument" in answer[5]
