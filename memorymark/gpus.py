"""The GPU catalog: what each GPU holds, costs and computes, and how much of it PyTorch can use.

Owns the `GPU` record, the built-in `CATALOG`, name lookup (`find_gpu`), GPUs outside the catalog
(`custom_gpu`, `detected_gpu`), the CUDA context estimate that separates a device's total memory
from what the caching allocator can reserve, and the cuBLAS workspaces every step allocates.

Must not know torch: the UI and report code import it, so it never imports torch or touches a
device; `detected_gpu` is handed a real device's properties by the code that asked torch. Nor
does it know workloads, search strategies or how anything is displayed.
"""

from __future__ import annotations

import difflib
import math
import re
from dataclasses import dataclass, replace

from memorymark.units import GIB, MIB

# --- Memory PyTorch cannot hand to tensors --------------------------------------------------
# CUDA context, with lazy module loading (CUDA_MODULE_LOADING=LAZY, which PyTorch sets by default
# since 1.13: pytorch/pytorch#86509). Measured points: #86509 (Oct 2022) shows 287,047,680 B used
# after init plus one small tensor (666,632,192 B with eager loading); ptrblck says "~300MB"
# (pytorch/pytorch#107667, Aug 2023) and "around 400MB" (#109888, Sep 2023). Part of the context
# is the per-thread stack reserve, SMs x resident threads x 1 KiB: "216MB on A100 (108SMs)"
# (arcs-skku/EMDC_llvm#13), i.e. ~40 MiB on a T4, ~264 MiB on an H100, ~296 MiB on a B200; and a
# training step lazily loads more cuBLAS/cuDNN/elementwise kernels than a bare init. Hence these
# per-architecture estimates: unverified here, not measured on every GPU; a real device's run
# measures its own peak. "other" (e.g. Volta, unknown) is treated like Ampere.
_CONTEXT_BYTES = {
    "turing": 300 * MIB,
    "ampere": 400 * MIB,
    "ada": 400 * MIB,
    "hopper": 512 * MIB,
    "blackwell": 600 * MIB,
    "other": 400 * MIB,
}
# cuBLAS workspace, pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (read at 26a39059
# and checked in the libtorch_cuda.so of every release 2.5.1 to 2.15.0): parseChosenWorkspaceSize
# defaults to ":4096:2:16:8", i.e. 4096*1024*2 + 16*1024*8 B, and to 32 MiB on compute capability
# 9.0 (2.5-2.11), majors 9, 10 and 12 (2.12-2.13, pytorch#175344), majors 9-12 (2.14 on).
_CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
_CUBLAS_WORKSPACE_LARGE_BYTES = 4096 * 8 * 1024
# cuBLASLt workspace, same file: CUBLASLT_WORKSPACE_SIZE defaults to 1024 KiB. Kept per (handle,
# stream) from 2.9 (pytorch#156495); shared with the cuBLAS one by default from 2.12 (so it adds
# nothing); before 2.9 allocated and freed around each call (a transient, not modelled).
_CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
# Workspaces are kept per (cuBLAS handle, stream) and handles are per CPU thread (thread-local
# PoolWindow, same file); autograd runs CUDA backward on its own device thread, so a training step
# holds two sets: the forward thread's and the backward thread's. getNewWorkspace() takes them
# from the caching allocator (`c10::cuda::CUDACachingAllocator::get()->allocate(size)`), so they
# count in memory_allocated/reserved: the allocator replay serves them, they are not overhead.
# From 2.15 they are no longer kept unless TORCH_CUBLAS_WORKSPACE_CACHE=1: each call allocates
# and frees its own (transient, not modelled), so nothing stays resident.
_WORKSPACE_SETS = 2


def workspace_allocations(
    compute_capability: tuple[int, int], torch_release: tuple[int, int]
) -> tuple[int, ...]:
    """The cuBLAS/cuBLASLt workspace requests a training step keeps allocated through the
    caching allocator on a GPU of `compute_capability` under torch `torch_release` (major,
    minor): one set per thread that runs matmuls."""
    if torch_release >= (2, 15):
        return ()
    major, minor = compute_capability
    if torch_release >= (2, 14):
        large = 9 <= major <= 12
    elif torch_release >= (2, 12):
        large = major in (9, 10, 12)
    else:
        large = (major, minor) == (9, 0)
    cublas = _CUBLAS_WORKSPACE_LARGE_BYTES if large else _CUBLAS_WORKSPACE_BYTES
    lt_kept = (2, 9) <= torch_release < (2, 12)
    one_set = (cublas, _CUBLASLT_WORKSPACE_BYTES) if lt_kept else (cublas,)
    return one_set * _WORKSPACE_SETS


# No "fragmentation allowance": the allocator replay (memorymark/allocator.py) already models
# rounding, segment packing, caching and release-and-retry. An earlier 3% of total double-counted
# it, and put the simulated maximum below real A10 runs for BERT, GPT-2 and ResNet-50.

# The GPU simulated when none is named and none is present: the most common cloud fine-tuning GPU.
DEFAULT_SIMULATED_GPU = "A10"
# A custom GPU bigger than this is a typo (the largest single GPUs hold under 300 GB in 2026).
MAX_CUSTOM_GIB = 2048.0
# Defaults for a GPU outside the catalog: round placeholders, deliberately not any real card;
# the user overrides them (UI slider / CLI flag).
DEFAULT_USD_PER_HOUR = 1.0
DEFAULT_BF16_TFLOPS = 100.0
DEFAULT_FP32_TFLOPS = 25.0
DEFAULT_BANDWIDTH_BYTES_PER_S = 1e12
# bf16 needs Ampere or newer: transformers' `is_torch_bf16_gpu_available` asks
# `torch.cuda.is_bf16_supported(including_emulation=False)`, which checks compute capability >= 8.0
# (torch/cuda/__init__.py), and TrainingArguments(bf16=True) raises without it.
BF16_MIN_CAPABILITY = (8, 0)
BF16_PRECISIONS = ("bf16-mixed", "bf16-true")

# Compute capability assumed for a GPU we know nothing about: Ampere's, the middle of the range,
# so it gets Ampere's context and workspace estimates.
UNKNOWN_COMPUTE_CAPABILITY = (8, 0)


@dataclass(frozen=True, slots=True, kw_only=True)
class GPU:
    """One GPU model: its memory as PyTorch sees it, default price and peak rates."""

    name: str
    """Display name, e.g. "A10", "A100 80GB"."""
    total_bytes: int
    """`torch.cuda.get_device_properties(0).total_memory`, not the marketing figure."""
    usd_per_hour: float
    """Default on-demand price of one GPU; the user overrides it."""
    bf16_tflops: float
    """Peak dense bf16 tensor-core TFLOP/s, no sparsity (fp16 on GPUs without bf16 units)."""
    fp32_tflops: float = DEFAULT_FP32_TFLOPS
    """Peak FP32 TFLOP/s without tensor cores: what fp32 matmuls run at by default (PyTorch
    keeps TF32 off for matmuls since 1.12)."""
    memory_bandwidth_bytes_per_s: float
    compute_capability: tuple[int, int]
    intra_node_bytes_per_s: float = 32e9
    """GPU-to-GPU bandwidth inside a node, one direction: NVLink where the GPU has it, else
    PCIe (see the catalog's sources)."""
    inter_node_bytes_per_s: float = 12.5e9 / 8
    """Network bandwidth per GPU between nodes, one direction (see the catalog's sources)."""
    aliases: tuple[str, ...] = ()
    nccl_bytes: int = 0
    """NCCL's buffers on each rank of a distributed run (an estimate: memorymark/distribution.py),
    held outside the caching allocator like the context; 0 on one GPU."""
    measured: bool = False
    """True only for the GPU detected on this machine at run time."""

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("GPU name must not be empty")
        if self.total_bytes <= 0:
            raise ValueError(f"{self.name}: total_bytes must be > 0, got {self.total_bytes}")
        for field, value in (
            ("usd_per_hour", self.usd_per_hour),
            ("bf16_tflops", self.bf16_tflops),
            ("fp32_tflops", self.fp32_tflops),
            ("memory_bandwidth_bytes_per_s", self.memory_bandwidth_bytes_per_s),
        ):
            if not math.isfinite(value) or value < 0 or (value == 0 and field != "usd_per_hour"):
                raise ValueError(f"{self.name}: {field} must be a positive number, got {value}")
        if len(self.compute_capability) != 2:
            raise ValueError(f"{self.name}: compute_capability must be (major, minor)")
        if self.usable_bytes <= 0:
            raise ValueError(
                f"{self.name}: {self.total_gib:.2f} GiB is too small to hold the CUDA context and "
                "workspaces"
            )

    @property
    def arch(self) -> str:
        """Architecture family from the compute capability."""
        major, minor = self.compute_capability
        if (major, minor) == (7, 5):
            return "turing"
        if major == 8:
            return "ada" if minor == 9 else "ampere"
        if major == 9:
            return "hopper"
        if major in (10, 11, 12):
            return "blackwell"
        return "other"

    @property
    def supports_bf16(self) -> bool:
        """True when the GPU computes in bf16 natively (Ampere and newer)."""
        return tuple(self.compute_capability) >= BF16_MIN_CAPABILITY

    def check_precision(self, precision: str) -> None:
        """Raise a one-line ValueError when `precision` cannot train on this GPU."""
        if precision in BF16_PRECISIONS and not self.supports_bf16:
            major, minor = self.compute_capability
            raise ValueError(
                f"the {self.name} has no bf16 support (compute capability {major}.{minor}, bf16 "
                f"needs 8.0 or newer): use --precision 16-mixed (fp16 autocast with a GradScaler)"
            )

    @property
    def context_bytes(self) -> int:
        """CUDA context plus lazily loaded kernels (an estimate per architecture)."""
        return _CONTEXT_BYTES[self.arch]

    @property
    def usable_bytes(self) -> int:
        """What the caching allocator can reserve for a training step: total less the CUDA
        context and NCCL's buffers (the capacity every fit verdict is judged against)."""
        return self.total_bytes - self.context_bytes - self.nccl_bytes

    @property
    def total_gib(self) -> float:
        return self.total_bytes / GIB

    @property
    def usable_gib(self) -> float:
        return self.usable_bytes / GIB


# --- The catalog ------------------------------------------------------------------------------
# total_bytes: torch.cuda.get_device_properties(i).total_memory on a named machine, or the same
# cudaMemGetInfo total as printed by a PyTorch OOM ("total capacity of X GiB"), by vLLM
# ("total_gpu_memory") or by Ultralytics' select_device ("CUDA:0 (NAME, NMiB)", total_memory /
# 2**20). It moves with the driver, and newer drivers leave less: in 2025-26 logs the L4 went from
# 22693 to 22563 MiB, the A100 40GB from 40514 to 40441, the L40S from 44.52 to 44.39 GiB, the RTX
# 4090 from 23.64 to 23.52 GiB. The newest figure found is used; one known to two decimals of a GiB
# is stored as round(GiB * 1024) MiB (+-5 MiB). nvidia-smi's total is larger and is not used (T4:
# 15360 vs 15095 MiB, RTX 4090: 24564 vs ~24084), nor deviceQuery runs on other drivers.
#   T4        15095 MiB  torch, driver 550.54.15, Colab, 2026-01-19: mryab/efficient-dl-systems
#                        week01_intro/seminar.ipynb @ e632aa89 ("total_memory=15095MB")
#   L4        22563 MiB  torch 2.11.0+cu128, Colab, 2026: pitikorn-pam/sack-train-ml
#                        docs/result.md @ e096d8c4 ("CUDA:0 (NVIDIA L4, 22563MiB)", and its OOM
#                        says 22.03 GiB). Logs with torch 2.5-2.8 (2025) printed 22693MiB; vLLM's
#                        L4 CI said 22.05 GiB (vllm-project/vllm#20214, 2025-06)
#   A10       22600 MiB  22.07 GiB, driver unknown: vLLM on an OCI A10 shape, 2025-03, both its
#                        mem_get_info "total_gpu_memory (22.07GiB)" and the OOM "total capacity of
#                        22.07 GiB" (oracle-samples/oci-data-science-ai-samples
#                        ai-quick-actions/troubleshooting-tips.md @ 03135b92); a Lambda gpu_1x_a10
#                        run with torch 2.7.0 recorded 22.07 GiB too (2026). An older driver gave
#                        22.18 GiB (OpenBMB/MiniCPM-V#640, 2024-10). 21.99 GiB was a deviceQuery.
#   A10G      22587 MiB  torch 2.15 dev + cu130: TorchCodec docs, CUDA decoding tutorial (an
#                        older AWS log prints 22723MB; the newer, smaller figure is used)
#   RTX 4090  24084 MiB  23.52 GiB on 2026 drivers: OOM in Soul-AILab/SoulX-FlashTalk#5
#                        (2026-01); a driver 595.84 log (repository not identified) prints the same
#                        beside nvidia-smi's 24564 MiB. Drivers of 2023-25 gave 23.64 GiB:
#                        24209 MiB in Ultralytics logs (torch 2.0-2.1), 25386352640 B in
#                        thamada/nvidia-smi gls/RTX4090_deviceQuery.py (driver 12.4), OOMs in
#                        TMElyralab/MuseTalk#76 and deepseek-ai/DeepSeek-V3#205. The former
#                        24563 MiB (23.99 GiB) matches nvidia-smi's board total, not what torch
#                        reports on Linux. A card driving a display has less.
#   L40S      45455 MiB  44.39 GiB, 2026: "a 48 GB L40S" in FX-DOVE/ltx2.5
#                        tests/test_oom_regression.py @ ea51009d; other 2026 L40S OOMs print the
#                        same. 2024: 45589 MiB with driver 550.54.14 (blog "Understanding GPU
#                        utilization strategies in Kubernetes"), 45495 MiB with torch 2.2.2
#   A100 40GB 40441 MiB  Colab A100-SXM4-40GB, torch 2.11.0+cu128 and +cu130, 2026: Ultralytics
#                        logs "(NVIDIA A100-SXM4-40GB, 40441MiB)" (repository not identified); an
#                        A100 40GB OOM says 39.50 GiB (TianheWu/CoSeR#10, 2025-01). Logs with
#                        torch 2.3-2.5 printed 40514MiB. 39.39 GiB was a deviceQuery.
#   A100 80GB 81051 MiB  A100-SXM4-80GB, torch 2.9.1+cu128, 2025-12: ultralytics/ultralytics#22877
#                        ("CUDA:0 (NVIDIA A100-SXM4-80GB, 81051MiB)"). Other torch logs on this
#                        card range 81038-81251 MiB; mixbench on a PCIe card (driver 12.3) 81049 MB
#   H100 80GB 81090 MiB  torch on 8x "NVIDIA H100 80GB HBM3": Stanford CS336 (spring 2025)
#                        lecture 6 notes; torch 2.7.0/cu12.8 prints 81089MB, torch 2.0.1 81082MB
#   H200      143156 MiB torch on Modal: ai-bot-pro/achatbot
#                        deploy/modal/src/llm/vllm/vlm/skywork_r1v.py; an Ultralytics log with
#                        torch 2.11.0+cu128 (2026) prints the same 143156MiB
#   V100 16GB 16160 MiB  torch 1.7-1.13 logs print 16160-16161 MiB (YOLOv5 Colab, 2020-23); no
#                        figure from a current driver found, so unverified for current drivers
# usd_per_hour: on-demand list prices, a default only (the UI slider / CLI flag overrides it).
#   Modal, as listed May 2026 (techbytes.app "Serverless GPU Pricing Matrix", verified 2026-05-07):
#     T4 0.5904, L4 0.7992, L40S 1.9512, A100 80GB 2.4984, H100 3.9492. Lambda, same page:
#     A10 0.86, A100 40GB 1.48. AWS g5.xlarge (1x A10G) 1.006, us-east-2, Apr 2024 (`sky show-gpus`
#     in skypilot-org/skypilot#3430). RunPod RTX 4090 0.60 on-demand, Mar 2026 (deploybase.ai
#     "RunPod GPU Pricing"). RunPod serverless H200 $0.00155/s = 5.58/h (docs.runpod.io/serverless/
#     pricing, 2025-26). Baseten V100 16GB 3.67, Aug 2023
#     (the-full-stack/the-full-stack-website#84).
# bf16_tflops (dense) and bandwidth: NVIDIA datasheets, sparsity figures halved: T4 (65 FP16, no
# bf16 tensor cores; 320 GB/s), L4 (121, 300 GB/s), A10 (125, 600 GB/s), L40S (362.05, 864 GB/s),
# A100 (312; 1555 GB/s 40GB SXM, 2039 GB/s 80GB SXM), H100 SXM (989.5, 3.35 TB/s), H200 (989.5,
# 4.8 TB/s), V100 SXM2 (125 FP16, no bf16; 900 GB/s); RTX 4090: Ada Lovelace architecture
# whitepaper (165.2 with FP32 accumulate, 1008 GB/s). A10G: no NVIDIA datasheet; 70 and 600 GB/s
# from Baseten's "NVIDIA A10 vs A10G" (unverified; a public log measured 67.1 TFLOPS cuBLAS).
# fp32_tflops (plain FP32, no tensor cores), same datasheets and whitepaper: T4 8.1, L4 30.3,
# A10 31.2, RTX 4090 82.6, L40S 91.6, A100 19.5, H100 SXM 67, H200 67, V100 SXM2 15.7. A10G:
# assumed equal to the A10's (the same GA102 with 9216 CUDA cores; unverified).
# intra_node_bytes_per_s (one direction; datasheets give both directions, halved here): NVLink
# 900 GB/s on H100 SXM and H200 (NVIDIA H100 and H200 datasheets), 600 GB/s on A100 SXM (A100
# datasheet), 300 GB/s on V100 SXM2 (V100 datasheet). GPUs without NVLink talk over PCIe: Gen4
# x16, 64 GB/s both ways (L4, A10, L40S datasheets; A10G and RTX 4090 are Gen4 cards too), Gen3
# x16, 32 GB/s, on the T4 (T4 datasheet). Ring collectives inside a node reach about these
# rates per GPU (nccl-tests' bus bandwidth, NVIDIA/nccl-tests doc/PERFORMANCE.md).
# inter_node_bytes_per_s (per GPU, one direction): DGX H100 has one 400 Gb/s ConnectX-7 port
# per GPU (DGX H100 datasheet) = 50 GB/s; DGX A100 one 200 Gb/s ConnectX-6 HDR port per GPU
# (DGX A100 datasheet) = 25 GB/s; H200 (HGX H200) as H100. Others are PCIe cloud instances: AWS
# g5.48xlarge (8x A10G) and g6.48xlarge (8x L4) list 100 Gb/s per instance, 12.5 GB/s over 8
# GPUs; the same is assumed for the other PCIe GPUs and the V100 (unverified: an assumption).
CATALOG: tuple[GPU, ...] = (
    GPU(name="T4", intra_node_bytes_per_s=16e9,
        total_bytes=15095 * MIB, usd_per_hour=0.5904, bf16_tflops=65.0,
        memory_bandwidth_bytes_per_s=320e9, compute_capability=(7, 5), fp32_tflops=8.1,
        aliases=("Tesla T4", "NVIDIA T4")),
    GPU(name="L4", intra_node_bytes_per_s=32e9,
        total_bytes=22563 * MIB, usd_per_hour=0.7992, bf16_tflops=121.0,
        memory_bandwidth_bytes_per_s=300e9, compute_capability=(8, 9), fp32_tflops=30.3,
        aliases=("NVIDIA L4",)),
    GPU(name="A10", total_bytes=22600 * MIB, usd_per_hour=0.86, bf16_tflops=125.0,
        memory_bandwidth_bytes_per_s=600e9, compute_capability=(8, 6), fp32_tflops=31.2,
        aliases=("NVIDIA A10",)),
    GPU(name="A10G", total_bytes=22587 * MIB, usd_per_hour=1.006, bf16_tflops=70.0,
        memory_bandwidth_bytes_per_s=600e9, compute_capability=(8, 6), fp32_tflops=31.2,
        aliases=("NVIDIA A10G",)),
    GPU(name="RTX 4090", total_bytes=24084 * MIB, usd_per_hour=0.60, bf16_tflops=165.2,
        memory_bandwidth_bytes_per_s=1008e9, compute_capability=(8, 9), fp32_tflops=82.6,
        aliases=("4090", "GeForce RTX 4090", "NVIDIA GeForce RTX 4090")),
    GPU(name="L40S", total_bytes=45455 * MIB, usd_per_hour=1.9512, bf16_tflops=362.05,
        memory_bandwidth_bytes_per_s=864e9, compute_capability=(8, 9), fp32_tflops=91.6,
        aliases=("NVIDIA L40S",)),
    GPU(name="A100 40GB", intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9,
        total_bytes=40441 * MIB, usd_per_hour=1.48, bf16_tflops=312.0,
        memory_bandwidth_bytes_per_s=1555e9, compute_capability=(8, 0), fp32_tflops=19.5,
        aliases=("A100-SXM4-40GB", "A100-PCIE-40GB", "A100 PCIe 40GB")),
    GPU(name="A100 80GB", intra_node_bytes_per_s=300e9, inter_node_bytes_per_s=25e9,
        total_bytes=81051 * MIB, usd_per_hour=2.4984, bf16_tflops=312.0,
        memory_bandwidth_bytes_per_s=2039e9, compute_capability=(8, 0), fp32_tflops=19.5,
        aliases=("A100-SXM4-80GB", "A100 80GB PCIe", "A100-PCIE-80GB")),
    GPU(name="H100 80GB", intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
        total_bytes=81090 * MIB, usd_per_hour=3.9492, bf16_tflops=989.5,
        memory_bandwidth_bytes_per_s=3.35e12, compute_capability=(9, 0), fp32_tflops=67.0,
        aliases=("H100", "H100 SXM", "H100 80GB HBM3", "H100-SXM5-80GB")),
    GPU(name="H200", intra_node_bytes_per_s=450e9, inter_node_bytes_per_s=50e9,
        total_bytes=143156 * MIB, usd_per_hour=5.58, bf16_tflops=989.5,
        memory_bandwidth_bytes_per_s=4.8e12, compute_capability=(9, 0), fp32_tflops=67.0,
        aliases=("NVIDIA H200", "H200 141GB")),
    GPU(name="V100 16GB", intra_node_bytes_per_s=150e9,
        total_bytes=16160 * MIB, usd_per_hour=3.67, bf16_tflops=125.0,
        memory_bandwidth_bytes_per_s=900e9, compute_capability=(7, 0), fp32_tflops=15.7,
        aliases=("V100-SXM2-16GB", "V100-PCIE-16GB")),
)  # fmt: skip


class UnknownGPUError(ValueError):
    """A GPU name the catalog does not know; the message is one line, for the CLI and the UI."""

    def __init__(self, name: str, suggestions: list[str] | None = None) -> None:
        self.name = name
        self.suggestions = suggestions or []
        quoted = [repr(s) for s in self.suggestions]
        maybe = " or ".join([", ".join(quoted[:-1]), quoted[-1]] if len(quoted) > 1 else quoted)
        hint = f" did you mean {maybe}?" if maybe else ""
        known = ", ".join(gpu_names())
        super().__init__(f"unknown GPU {name!r};{hint} known: {known} (or pass --gpu-memory GIB)")


def _key(name: str) -> str:
    """Lower case, no spaces, dashes or underscores, and no leading vendor words that device
    names carry but users leave out ("NVIDIA GeForce RTX 4090", "Tesla T4")."""
    key = re.sub(r"[\s\-_]+", "", name.lower())
    return re.sub(r"^(?:nvidia|geforce|tesla)+", "", key) or key


def _index() -> dict[str, GPU]:
    index: dict[str, GPU] = {}
    for gpu in CATALOG:
        for label in (gpu.name, *gpu.aliases):
            index.setdefault(_key(label), gpu)
    return index


_INDEX = _index()


def _suggest(key: str, limit: int = 4, cutoff: float = 0.5) -> list[str]:
    """Catalog names whose best label starts with `key` or is close to it (difflib ratio)."""
    best: dict[str, float] = {}
    for label, gpu in _INDEX.items():
        prefix = len(key) >= 2 and label.startswith(key)  # "a100" -> both A100s, first
        score = 2.0 if prefix else difflib.SequenceMatcher(None, key, label).ratio()
        if score >= cutoff and score > best.get(gpu.name, 0.0):
            best[gpu.name] = score
    return sorted(best, key=lambda n: -best[n])[:limit]


def find_gpu(name: str) -> GPU:
    """The catalog GPU called `name` or one of its aliases, ignoring case and separators."""
    key = _key(name)
    if key in _INDEX:
        return _INDEX[key]
    raise UnknownGPUError(name, _suggest(key))


def gpu_names() -> list[str]:
    """Display names of the catalog, in catalog order."""
    return [gpu.name for gpu in CATALOG]


def custom_gpu(
    total_gib: float,
    *,
    name: str | None = None,
    usd_per_hour: float = DEFAULT_USD_PER_HOUR,
    bf16_tflops: float = DEFAULT_BF16_TFLOPS,
    fp32_tflops: float = DEFAULT_FP32_TFLOPS,
    memory_bandwidth_bytes_per_s: float = DEFAULT_BANDWIDTH_BYTES_PER_S,
) -> GPU:
    """A GPU outside the catalog with `total_gib` GiB as PyTorch reports total_memory.

    Its compute capability is unknown, so it is treated as Ampere (8, 0) for the overheads.
    """
    if not math.isfinite(total_gib) or total_gib <= 0 or total_gib > MAX_CUSTOM_GIB:
        raise ValueError(
            f"GPU memory must be between 0 and {MAX_CUSTOM_GIB:g} GiB, got {total_gib}"
        )
    return GPU(
        name=name or f"Custom {total_gib:g} GiB",
        total_bytes=int(total_gib * GIB),
        usd_per_hour=usd_per_hour,
        bf16_tflops=bf16_tflops,
        fp32_tflops=fp32_tflops,
        memory_bandwidth_bytes_per_s=memory_bandwidth_bytes_per_s,
        compute_capability=UNKNOWN_COMPUTE_CAPABILITY,
    )


def detected_gpu(name: str, total_bytes: int, compute_capability: tuple[int, int]) -> GPU:
    """The GPU on this machine, from the properties torch reported (passed in, never queried here).

    A device the catalog knows keeps the catalog's display name, price and peak rates; its memory
    and compute capability are the device's own. An unknown device gets the custom defaults.
    """
    major, minor = compute_capability
    try:
        known = find_gpu(name)
    except UnknownGPUError:
        return GPU(
            name=name,
            total_bytes=total_bytes,
            usd_per_hour=DEFAULT_USD_PER_HOUR,
            bf16_tflops=DEFAULT_BF16_TFLOPS,
            memory_bandwidth_bytes_per_s=DEFAULT_BANDWIDTH_BYTES_PER_S,
            compute_capability=(int(major), int(minor)),
            measured=True,
        )
    aliases = known.aliases if name in known.aliases else (*known.aliases, name)
    return replace(
        known,
        total_bytes=total_bytes,
        compute_capability=(int(major), int(minor)),
        aliases=aliases,
        measured=True,
    )
