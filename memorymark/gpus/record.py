"""One GPU as MemoryMark sees it: the `GPU` record, and the memory PyTorch cannot hand to tensors.

Owns the `GPU` dataclass (memory as PyTorch reports it, price, peak rates, compute capability),
its validation, the CUDA context estimate per architecture that separates total memory from what
the caching allocator can reserve, bf16 support, and the defaults for a GPU outside the catalog.
Must not know torch, the catalog's entries, name lookup, workloads or how anything is displayed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from memorymark.units import GIB, MIB

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

# No "fragmentation allowance": the allocator replay (memorymark/accounting/allocator.py)
# already models rounding, segment packing, caching and release-and-retry. An earlier 3% of
# total double-counted it, and put the simulated maximum below real A10 runs for BERT, GPT-2
# and ResNet-50.

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
# (torch/cuda/__init__.py), and TrainingArguments(bf16=True) raises without it. NVIDIA's own:
# bf16 Tensor Core math is new in Ampere (NVIDIA A100 Tensor Core GPU Architecture whitepaper,
# 2020, "third-generation Tensor Cores"), and the T4 (Turing, 7.5) and V100 (Volta, 7.0)
# datasheets list FP16 tensor rates and none for bf16.
BF16_MIN_CAPABILITY = (8, 0)
BF16_PRECISIONS = ("bf16-mixed", "bf16-true")
# TF32 tensor cores arrived with Ampere too (NVIDIA A100 Tensor Core GPU Architecture
# whitepaper, 2020: "TF32 ... new in the A100"), hence the same 8.0.
TF32_MIN_CAPABILITY = (8, 0)

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
    bf16_tflops: float | None
    """Peak dense bf16 tensor-core TFLOP/s, no sparsity; None on a GPU without bf16 (compute
    capability below 8.0: the T4, the V100)."""
    fp16_tflops: float | None = None
    """Peak dense fp16 tensor-core TFLOP/s (FP32 accumulate), no sparsity; None: the same as
    `bf16_tflops` (every catalog GPU with bf16 lists both at one rate)."""
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
    """NCCL's buffers on each rank of a distributed run (an estimate:
    memorymark/distributed/topology.py), held outside the caching allocator like the context;
    0 on one GPU."""
    measured: bool = False
    """True only for the GPU detected on this machine at run time."""

    def __post_init__(self) -> None:
        if not self.name.strip():
            raise ValueError("GPU name must not be empty")
        if self.total_bytes <= 0:
            raise ValueError(f"{self.name}: total_bytes must be > 0, got {self.total_bytes}")
        if self.bf16_tflops is not None and not self.supports_bf16:
            # A record saved before bf16 and fp16 were told apart held the fp16 rate as bf16's.
            if self.fp16_tflops is None:
                object.__setattr__(self, "fp16_tflops", self.bf16_tflops)
            object.__setattr__(self, "bf16_tflops", None)
        if self.bf16_tflops is None and self.fp16_tflops is None:
            raise ValueError(f"{self.name}: give fp16_tflops (or bf16_tflops)")
        rates = (("bf16_tflops", self.bf16_tflops), ("fp16_tflops", self.fp16_tflops))
        for field, value in (
            ("usd_per_hour", self.usd_per_hour),
            *((name, rate) for name, rate in rates if rate is not None),
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
    def half_tflops(self) -> float:
        """The tensor-core rate of 16-bit math: fp16's (bf16 runs at the same rate where it
        exists)."""
        half = self.fp16_tflops if self.fp16_tflops is not None else self.bf16_tflops
        assert half is not None  # __post_init__ refuses a GPU with neither
        return half

    @property
    def tf32_tflops(self) -> float | None:
        """Dense TF32 tensor-core TFLOP/s (estimated), or None before Ampere, which has no TF32.

        What fp32 matmuls get when a script turns TF32 on (torch.backends.cuda.matmul.allow_tf32
        = True); PyTorch leaves it off for matmuls since 1.12. Every datasheet in the catalog
        gives the dense TF32 rate as half the dense FP16/BF16 one (A100 156/312, A10 62.5/125,
        H100 SXM 494.7/989.5, L4 60/121, RTX 4090 82.6/165.2), so half of that is used here."""
        if tuple(self.compute_capability) < TF32_MIN_CAPABILITY:
            return None
        return max(self.fp32_tflops, self.half_tflops / 2)

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

    def check_attention(self, attention: str) -> None:
        """Raise a one-line ValueError when `attention` has no kernel for this GPU."""
        # flash-attn 2's README: "FlashAttention-2 currently supports Ampere, Ada, or Hopper
        # GPUs"; mha_fwd checks is_sm8x || is_sm90 (csrc/flash_attn/flash_api.cpp).
        if attention == "flash_attention_2" and self.compute_capability < (8, 0):
            major, minor = self.compute_capability
            raise ValueError(
                f"flash_attention_2 needs an Ampere or newer GPU (compute capability 8.0); the "
                f"{self.name} is {major}.{minor}: use --attention sdpa"
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
