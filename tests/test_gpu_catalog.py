"""The GPU catalog: lookup, overheads, custom and detected GPUs. CPU-only and fast."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from memorymark import gpus
from memorymark.gpus import UnknownGPUError, custom_gpu, detected_gpu, find_gpu
from memorymark.units import GIB, MIB

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("a10", "A10"),
        ("A100-80GB", "A100 80GB"),
        ("a100_80gb", "A100 80GB"),
        ("h100", "H100 80GB"),
        ("NVIDIA A10G", "A10G"),
        ("Tesla T4", "T4"),
        ("NVIDIA H100 80GB HBM3", "H100 80GB"),
        ("NVIDIA A100-SXM4-80GB", "A100 80GB"),
        ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
        ("NVIDIA GeForce RTX 4090", "RTX 4090"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA H200", "H200"),
        ("Tesla V100-SXM2-16GB", "V100 16GB"),
    ],
)
def test_find_gpu_resolves_display_names_aliases_and_torch_device_names(name, expected):
    assert find_gpu(name).name == expected


def test_find_gpu_ignores_case_spaces_dashes_and_underscores():
    assert find_gpu("  a100 - 80 gb ") is find_gpu("A100_80GB") is find_gpu("a10080gb")
    assert find_gpu("rtx-4090") is find_gpu("RTX 4090") is find_gpu("4090")


def test_find_gpu_returns_the_figures_chosen_for_the_catalog():
    assert find_gpu("a10").total_bytes == 22600 * MIB
    assert find_gpu("t4").total_bytes == 15095 * MIB
    assert find_gpu("h100").total_bytes == 81090 * MIB
    assert find_gpu("h200").memory_bandwidth_bytes_per_s == 4.8e12
    assert find_gpu("a100 80gb").bf16_tflops == 312.0
    assert find_gpu("a10").compute_capability == (8, 6)


def test_unknown_gpu_message_is_one_line_and_suggests_the_close_name():
    with pytest.raises(UnknownGPUError) as caught:
        find_gpu("h1OO")
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith("unknown GPU 'h1OO';")
    assert "'H100 80GB'" in message
    assert message.endswith("(or pass --gpu-memory GIB)")
    assert caught.value.suggestions[0] == "H100 80GB"


def test_unknown_gpu_suggests_a100s_for_a_typo_and_for_the_ambiguous_bare_name():
    with pytest.raises(UnknownGPUError) as typo:
        find_gpu("A1000")
    with pytest.raises(UnknownGPUError) as bare:
        find_gpu("a100")
    assert typo.value.suggestions[:2] == ["A100 40GB", "A100 80GB"]
    assert bare.value.suggestions[:2] == ["A100 40GB", "A100 80GB"]


def test_unknown_gpu_without_close_names_lists_the_catalog():
    with pytest.raises(UnknownGPUError, match="did you mean") as caught:
        find_gpu("B200")
    with pytest.raises(UnknownGPUError) as nothing_close:
        find_gpu("x")
    assert "did you mean" not in str(nothing_close.value)
    assert "known: " + ", ".join(gpus.gpu_names()) in str(nothing_close.value)
    assert isinstance(caught.value, ValueError)


def test_gpu_names_cover_the_required_gpus_in_catalog_order():
    names = gpus.gpu_names()
    assert names == [g.name for g in gpus.CATALOG]
    for required in ("T4", "L4", "A10", "A10G", "RTX 4090", "A100 40GB", "A100 80GB"):
        assert required in names
    assert {"H100 80GB", "H200", "L40S", "V100 16GB"} <= set(names)
    assert len(set(names)) == len(names)


@pytest.mark.parametrize("gpu", gpus.CATALOG, ids=lambda g: g.name)
def test_every_catalog_entry_is_complete_and_loses_some_memory_to_overheads(gpu):
    assert gpu.usd_per_hour > 0
    assert gpu.half_tflops > 0 and gpu.memory_bandwidth_bytes_per_s > 0
    assert len(gpu.compute_capability) == 2 and gpu.arch != ""
    assert gpu.context_bytes > 0
    # The caching allocator serves the workspaces, so only the context is outside usable memory.
    assert gpu.usable_bytes == gpu.total_bytes - gpu.context_bytes
    assert 0.95 * gpu.total_bytes < gpu.usable_bytes < gpu.total_bytes
    assert gpu.measured is False
    assert find_gpu(gpu.name) is gpu


def test_total_is_what_pytorch_reports_not_the_marketing_figure():
    # An "80GB" card reports about 79.2 GiB to PyTorch; a "16GB" T4 about 14.7 GiB.
    assert find_gpu("h100").total_gib == pytest.approx(79.19, abs=0.01)
    assert find_gpu("t4").total_gib == pytest.approx(14.74, abs=0.01)
    assert find_gpu("a100 80gb").total_gib < 80


def test_architecture_follows_compute_capability():
    assert [find_gpu(n).arch for n in ("t4", "a10", "a100 40gb", "l4", "h100", "v100 16gb")] == [
        "turing",
        "ampere",
        "ampere",
        "ada",
        "hopper",
        "other",
    ]
    assert detected_gpu("NVIDIA B200", 180 * GIB, (10, 0)).arch == "blackwell"


SMALL_WS = 4096 * 1024 * 2 + 16 * 1024 * 8  # CublasHandlePool.cpp ":4096:2:16:8"


@pytest.mark.parametrize(
    ("capability", "release", "expected"),
    [
        # Two sets (the forward thread's handle and autograd's backward thread's).
        ((8, 6), (2, 8), (SMALL_WS,) * 2),  # cuBLASLt's 1 MiB is per call: transient
        ((8, 6), (2, 11), (SMALL_WS, MIB) * 2),  # 2.9-2.11 keep a cuBLASLt workspace too
        ((8, 6), (2, 13), (SMALL_WS,) * 2),  # 2.12 on: cuBLASLt shares cuBLAS's
        ((9, 0), (2, 11), (32 * MIB, MIB) * 2),  # 32 MiB on sm90
        ((10, 0), (2, 11), (SMALL_WS, MIB) * 2),  # Blackwell got 32 MiB only from 2.12
        ((10, 0), (2, 13), (32 * MIB,) * 2),
        ((11, 0), (2, 13), (SMALL_WS,) * 2),
        ((11, 0), (2, 14), (32 * MIB,) * 2),
        ((8, 6), (2, 15), ()),  # 2.15: per-call workspaces unless TORCH_CUBLAS_WORKSPACE_CACHE
    ],
)
def test_cublas_workspaces_follow_each_torch_release(capability, release, expected):
    assert gpus.workspace_allocations(capability, release) == expected


def test_hopper_context_is_larger_than_amperes():
    assert find_gpu("h100").context_bytes > find_gpu("a100 80gb").context_bytes


def test_no_fragmentation_allowance_on_top_of_the_allocator_replay():
    assert not hasattr(gpus, "FRAGMENTATION_FRACTION")
    assert not hasattr(find_gpu("a10"), "fragmentation_bytes")


def test_custom_gpu_has_the_memory_asked_for_and_amperes_overheads():
    gpu = custom_gpu(24)
    assert gpu.total_bytes == 24 * GIB
    assert gpu.name == "Custom 24 GiB"
    assert gpu.compute_capability == (8, 0) and gpu.arch == "ampere"
    assert gpu.usable_bytes == 24 * GIB - 400 * MIB
    assert gpu.measured is False


def test_custom_gpu_takes_name_price_and_rates():
    gpu = custom_gpu(
        11.5, name="My card", usd_per_hour=0.2, bf16_tflops=50, memory_bandwidth_bytes_per_s=5e11
    )
    assert (gpu.name, gpu.usd_per_hour, gpu.bf16_tflops) == ("My card", 0.2, 50)
    assert gpu.total_bytes == int(11.5 * GIB)


@pytest.mark.parametrize("total_gib", [0, -1, float("nan"), float("inf"), 5000, 0.1])
def test_custom_gpu_rejects_nonsense_memory(total_gib):
    with pytest.raises(ValueError):
        custom_gpu(total_gib)


def test_custom_gpu_rejects_bad_rates():
    with pytest.raises(ValueError, match="bf16_tflops"):
        custom_gpu(24, bf16_tflops=0)
    with pytest.raises(ValueError, match="usd_per_hour"):
        custom_gpu(24, usd_per_hour=-1)
    assert custom_gpu(24, usd_per_hour=0).usd_per_hour == 0  # an owned GPU costs nothing per hour


def test_detected_gpu_keeps_catalog_name_and_rates_with_the_devices_own_memory():
    reported = 22723 * MIB  # an A10G under an older driver reports more than the catalog figure
    gpu = detected_gpu("NVIDIA A10G", reported, (8, 6))
    catalog = find_gpu("a10g")
    assert gpu.measured is True
    assert gpu.name == "A10G" == catalog.name
    assert gpu.total_bytes == reported
    assert (gpu.usd_per_hour, gpu.bf16_tflops) == (catalog.usd_per_hour, catalog.bf16_tflops)
    assert gpu.memory_bandwidth_bytes_per_s == catalog.memory_bandwidth_bytes_per_s
    assert catalog.measured is False and catalog.total_bytes == 22587 * MIB  # catalog untouched


def test_detected_gpu_adds_the_device_name_as_an_alias():
    gpu = detected_gpu("NVIDIA H100 80GB HBM3", 81089 * MIB, (9, 0))
    assert gpu.name == "H100 80GB"
    assert "NVIDIA H100 80GB HBM3" in gpu.aliases
    assert gpu.compute_capability == find_gpu("h100").compute_capability


def test_detected_unknown_gpu_keeps_its_own_name_and_default_rates():
    gpu = detected_gpu("NVIDIA A100-SXM4-80GB MIG 3g.40gb", 42144366592, (8, 0))
    assert gpu.name == "NVIDIA A100-SXM4-80GB MIG 3g.40gb"
    assert gpu.measured is True
    assert gpu.total_bytes == 42144366592
    assert gpu.bf16_tflops == gpus.DEFAULT_BF16_TFLOPS
    assert gpu.usd_per_hour == gpus.DEFAULT_USD_PER_HOUR


def test_gpu_is_frozen_and_validated():
    gpu = find_gpu("t4")
    with pytest.raises(dataclasses.FrozenInstanceError):
        gpu.total_bytes = 1  # type: ignore[misc]
    with pytest.raises(ValueError, match="total_bytes"):
        dataclasses.replace(gpu, total_bytes=0)
    with pytest.raises(ValueError, match="too small"):
        dataclasses.replace(gpu, total_bytes=100 * MIB)


def test_importing_the_catalog_does_not_import_torch():
    code = "import sys, memorymark.gpus; sys.exit('torch' in sys.modules)"
    root = Path(__file__).resolve().parents[1]
    assert subprocess.run([sys.executable, "-c", code], cwd=root, check=False).returncode == 0


@pytest.mark.parametrize(("name", "ok"), [("t4", False), ("V100 16GB", False), ("a10", True)])
def test_bf16_needs_ampere_and_the_error_names_the_fp16_way(name, ok):
    gpu = find_gpu(name)
    assert gpu.supports_bf16 is ok
    gpu.check_precision("16-mixed")  # fp16 runs everywhere
    if ok:
        gpu.check_precision("bf16-mixed")
        return
    for precision in ("bf16-mixed", "bf16-true"):
        with pytest.raises(ValueError, match="no bf16 support .* use --precision 16-mixed"):
            gpu.check_precision(precision)


def test_the_catalog_claims_no_bf16_rate_for_a_gpu_without_bf16():
    for gpu in gpus.CATALOG:
        assert (gpu.bf16_tflops is not None) is gpu.supports_bf16, gpu.name
        assert (gpu.tf32_tflops is not None) is gpu.supports_bf16, gpu.name
    t4, v100 = find_gpu("T4"), find_gpu("V100 16GB")
    assert (t4.bf16_tflops, t4.half_tflops, v100.bf16_tflops, v100.half_tflops) == (
        None, 65.0, None, 125.0)  # fmt: skip
    assert (find_gpu("A100 80GB").half_tflops, find_gpu("A100 80GB").tf32_tflops) == (312, 156)


def test_a_record_that_gave_a_pre_ampere_gpu_a_bf16_rate_reads_it_as_fp16():
    # Records saved before bf16 and fp16 were told apart hold the T4's 65 as bf16_tflops.
    old = dataclasses.replace(find_gpu("A10"), name="T4", compute_capability=(7, 5),
                              bf16_tflops=65.0)  # fmt: skip
    assert (old.bf16_tflops, old.fp16_tflops, old.half_tflops) == (None, 65.0, 65.0)


def test_gpus_lists_no_bf16_for_the_t4_and_v100(capsys):
    from memorymark.cli.parser import main

    assert main(["gpus"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()}
    assert rows["T4"][4:8] == ["—", "65", "—", "8.1"]  # bf16, fp16, tf32, fp32
    assert rows["A100"][5:9] == ["312", "312", "156", "19.5"]  # "A100 40GB" splits in two
    assert main(["gpus", "--json"]) == 0
    t4 = json.loads(capsys.readouterr().out)[0]
    assert (t4["bf16_tflops"], t4["fp16_tflops"], t4["tf32_tflops"]) == (None, 65.0, None)


def test_bf16_on_a_t4_is_refused_before_any_step_and_compare_leaves_it_out():
    from memorymark.analyses.compare import without_precision
    from memorymark.engine import Session
    from memorymark.settings import Settings

    with pytest.raises(ValueError, match="the T4 has no bf16 support"):
        Session(Settings(model="tiny-bert", gpu="t4", precision="bf16-mixed"))
    names = [g.name for g in without_precision(Settings(precision="bf16-true"))]
    assert names == ["T4", "V100 16GB"]
    assert without_precision(Settings(precision="16-mixed")) == []
