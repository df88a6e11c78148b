"""Real many-GPU measurement under torchrun: every rank sweeps in lock-step, agreeing on each
probe with an all-reduce, and only rank 0 prints. Run on CPU with gloo (2 ranks, tiny model);
the same protocol on CUDA with NCCL is marked `gpu`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from memorymark.cli.parser import main

ROOT = Path(__file__).resolve().parents[1]


def torchrun(nproc: int, *args: str, timeout: int = 240) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", f"--nproc-per-node={nproc}", *args]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}  # a script outside the checkout imports it
    return subprocess.run(
        command, capture_output=True, text=True, cwd=ROOT, timeout=timeout, check=False, env=env
    )


def test_two_cpu_ranks_sweep_in_lock_step_and_rank_0_prints_one_json():
    result = torchrun(
        2, "-m", "memorymark", "analyze", "tiny-gpt2", "--seq-len", "32", "--backend", "cpu",
        "--gpu-memory", "1", "--dist", "fsdp", "--gpus", "2", "--max-batch", "16", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    d = json.loads(result.stdout)  # one object: rank 1 printed nothing
    assert d["backend"] == "cpu"
    assert d["distributed"]["gpus"] == 2
    assert d["distributed"]["per_gpu_batch"] == 16
    assert d["distributed"]["global_batch"] == 32
    assert [r["batch_size"] for r in d["results"]] == [8, 16]


AGREE = textwrap.dedent(
    """
    import torch.distributed as dist
    from memorymark.backends import torchrun
    from memorymark.measurement import Measurement

    torchrun.ensure_process_group("cpu")
    me = torchrun.rank()
    # Rank 1 runs out of memory at this batch; rank 0 fits with fewer bytes.
    m = Measurement(batch_size=4, fits=me == 0, runs=me == 0, peak_bytes=100 + me,
                    required_bytes=1000 * (me + 1), backend="cpu", measured=False)
    agreed = torchrun.agree(m, "cpu")
    # One file per rank: two processes printing to one pipe can interleave their lines.
    with open(f"{{OUT}}/{me}.txt", "w") as out:
        print(me, agreed.runs, agreed.fits, agreed.peak_bytes, agreed.required_bytes, file=out)
    """
)


def test_ranks_agree_that_a_probe_ran_out_of_memory_when_any_rank_did(tmp_path):
    script = tmp_path / "agree.py"
    script.write_text(AGREE.replace("{{OUT}}", str(tmp_path)))
    result = torchrun(2, str(script), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [(tmp_path / f"{r}.txt").read_text().strip() for r in (0, 1)]
    assert lines == ["0 False False 101 2000", "1 False False 101 2000"]


def test_many_real_gpus_outside_torchrun_is_refused_in_one_line(capsys):
    status = main(
        ["analyze", "tiny-gpt2", "--backend", "cpu", "--dist", "fsdp", "--gpus", "2",
         "--gpu-memory", "1"]
    )  # fmt: skip
    assert status == 2
    assert "torchrun --nproc-per-node 2" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA GPUs")
def test_two_cuda_ranks_measure_fsdp_with_nccl():
    result = torchrun(
        2, "-m", "memorymark", "analyze", "gpt2", "--seq-len", "256", "--backend", "cuda",
        "--dist", "fsdp", "--gpus", "2", "--max-batch", "32", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    d = json.loads(result.stdout)
    assert d["memory_source"] == "measured"
    assert d["distributed"]["per_gpu_batch"] >= 1


def test_tensor_parallel_real_cpu_ranks_hold_the_simulated_bytes(capsys):
    # fp32 and eager attention: the CPU's kernels are the ones the simulation runs.
    args = ["tiny-llama", "--seq-len", "512", "--gpu-memory", "1", "--precision", "32-true",
            "--attention", "eager", "--dist", "fsdp", "--gpus", "2", "--tp", "2",
            "--batch-size", "4", "--json"]  # fmt: skip
    result = torchrun(2, "-m", "memorymark", "measure", *args, "--backend", "cpu")
    assert result.returncode == 0, result.stderr[-2000:]
    real = json.loads(result.stdout)
    assert main(["measure", *args, "--backend", "sim"]) == 0
    simulated = json.loads(capsys.readouterr().out)
    assert real["breakdown"] == simulated["breakdown"]
    # Byte for byte: the mesh's rank layout, a host tensor, is not counted on the CPU either.
    assert real["peak_bytes"] == simulated["peak_bytes"]


@pytest.mark.parametrize(("gpus", "tp"), [(2, 1), (4, 2)], ids=["pp", "tp-x-pp"])
def test_cpu_pipeline_ranks_hold_the_bytes_the_simulation_gives(gpus, tp):
    # Each rank runs its stage (split by tensor parallelism first, where tp is 2) with gloo's
    # real send and receive; rank 0 prints the largest peak.
    result = torchrun(
        gpus, "-m", "memorymark", "measure", "tiny-llama", "--seq-len", "32", "--backend",
        "cpu", "--gpu-memory", "1", "--gpus", str(gpus), "--tp", str(tp), "--pp", "2",
        "--microbatches", "2", "--dist", "fsdp", "--batch-size", "4", "--json",
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    real = json.loads(result.stdout)["peak_bytes"]
    from memorymark import Settings
    from memorymark import gpus as catalog
    from memorymark.backends import pipeline_sim
    from memorymark.cuda_rules import versions
    from memorymark.fit import FitPolicy
    from memorymark.units import GIB

    settings = Settings(model="tiny-llama", seq_len=32, backend="sim", gpu_memory_gib=1,
                        gpus=str(gpus), tp=tp, pp=2, microbatches=2, dist="fsdp")  # fmt: skip
    gpu = catalog.custom_gpu(1)
    workspace = catalog.thread_workspace(gpu.compute_capability, versions.release())

    def stage(step):  # CPU's kernels, as the cpu backend runs them (test_backends.py)
        return pipeline_sim.StageSimBackend(
            step, gpu=gpu, policy=FitPolicy(capacity_bytes=GIB), thread_workspace=workspace,
            cuda_rules=False,
        )  # fmt: skip

    simulated = pipeline_sim.PipelineSimBackend(settings, stage).measure(4)
    largest = max(s.peak_bytes for s in simulated.stages)
    # Byte for byte (19,834,744 for PP, 8,913,912 for TP x PP). A CPU run once counted 12
    # bytes more: the mesh's rank layout and a tensor torch.distributed.pipelining makes at
    # import, both host memory on a GPU.
    assert real == largest
