"""How fast one training step runs: estimated from FLOPs and bytes, or timed on the device.

Estimated (simulation, no GPU): every operator the step dispatches is costed on a roofline of the
target GPU, max(FLOPs / peak FLOP/s, bytes moved / memory bandwidth), the costs are summed, and
the sum is divided by `EFFICIENCY`. FLOPs come from `torch.utils.flop_counter.flop_registry`, the
formulas `FlopCounterMode` uses, which read only shapes and so work on fake tensors; bytes moved
are the bytes of the operator's tensor inputs and outputs, a rough proxy. Not modelled: kernel
launch and Python overhead (they weigh most at small batches, so the estimate tends to understate
what a larger batch gains), kernel fusion, overlap, and caches.

Measured (CUDA, MPS): a warm-up step, `synchronize()`, then the median of a few timed steps.

This module knows nothing about memory, models or search; the tracker hands it operators and the
backend hands it a step to time.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils.flop_counter import flop_registry

from memorymark.accounting.tracker import MemoryTracker
from memorymark.gpus import GPU

# The fraction of the roofline bound a real training step reaches. End-to-end model FLOPs
# utilisation of large training runs: 52% of peak for Megatron-LM on A100s (Narayanan et al.,
# "Efficient Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", SC'21,
# abstract), 46.2% for PaLM and 21-33% for GPT-3, Gopher and MT-NLG (Chowdhery et al., "PaLM",
# 2022, table 3). Those figures count memory-bound operators as lost time, while the roofline
# here already charges them at full bandwidth, so the upper end of that range is used. The
# factor scales absolute samples/s only: a speedup (a ratio of two batch sizes' throughput) and
# the savings derived from it do not depend on it.
EFFICIENCY = 0.5

_HALF = (torch.bfloat16, torch.float16)
_aten = torch.ops.aten
# Convolutions: cuDNN may use TF32 tensor cores for fp32 by default (torch.backends.cudnn
# .allow_tf32 is True, `cudnn.conv.fp32_precision` "tf32"); matmuls may not
# (torch.backends.cuda.matmul.allow_tf32 is False by default since PyTorch 1.12), so fp32
# matmuls run at the plain FP32 rate. PyTorch docs, "CUDA semantics: TensorFloat-32 (TF32) on
# Ampere (and later) devices".
_CONVOLUTIONS = frozenset(
    {_aten.convolution, _aten._convolution, _aten.convolution_backward, _aten.cudnn_convolution}
)
# Operators that launch no kernel: they only reserve memory (or read metadata).
_NO_KERNEL = frozenset(
    {_aten.empty, _aten.empty_like, _aten.empty_strided, _aten.new_empty, _aten.lift_fresh}
)


@dataclass(frozen=True, slots=True)
class Roofline:
    """Peak rates of one GPU, per operator kind."""

    half_flops_per_s: float
    """bf16/fp16 tensor-core rate (dense)."""
    fp32_flops_per_s: float
    """fp32 matmuls' rate: plain FP32 by default, TF32 when a script turns it on."""
    conv_fp32_flops_per_s: float
    """fp32 convolutions: TF32 tensor cores on Ampere and later, else plain FP32."""
    bytes_per_s: float

    @classmethod
    def for_gpu(cls, gpu: GPU, *, tf32: bool = False) -> Roofline:
        """The rates of a catalog (or custom) GPU; with `tf32` (a script that sets
        torch.backends.cuda.matmul.allow_tf32 = True), fp32 matmuls run at the TF32 rate too."""
        fp32 = gpu.fp32_tflops * 1e12
        tf32_rate = (gpu.tf32_tflops or gpu.fp32_tflops) * 1e12  # plain FP32 before Ampere
        matmul = tf32_rate if tf32 else fp32
        return cls(gpu.half_tflops * 1e12, matmul, tf32_rate, gpu.memory_bandwidth_bytes_per_s)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """What one rank holds of `tensor`: a DTensor's local tensor (read by name, so a step
    without torch.distributed never imports it), else the tensor."""
    return getattr(tensor, "_local_tensor", tensor)


def _split_over(values: Any) -> int:
    """Ranks a DTensor operator's work is split over: the mesh dimensions its first DTensor
    output is sharded or a partial sum on (each rank computes its part there, all of it where
    the output is replicated); 1 for plain tensors. A tensor-parallel step is dispatched at
    the DTensor level, with global shapes, so its FLOPs are divided here."""
    for value in values:
        placements = getattr(value, "placements", None)
        if placements is not None:
            shape = value.device_mesh.shape
            return math.prod(
                n for n, p in zip(shape, placements, strict=True) if not p.is_replicate()
            )
    return 1


def _tensor_bytes(values: Any) -> tuple[int, torch.dtype | None]:
    """Bytes one rank reads or writes of the tensors in `values` (one level of lists), and the
    first one's dtype."""
    total, dtype = 0, None
    for value in values:
        if isinstance(value, torch.Tensor):
            total += _local(value).nbytes
            dtype = dtype or value.dtype
        elif isinstance(value, (list, tuple)):
            for item in value:
                if isinstance(item, torch.Tensor):
                    total += _local(item).nbytes
                    dtype = dtype or item.dtype
    return total, dtype


def _shape(value: Any) -> Any:
    """A tensor's shape, one level into lists and tuples; anything else as it is."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return type(value)(v.shape if isinstance(v, torch.Tensor) else v for v in value)
    return value


_FLOPS_KEPT = 4096
"""Operator signatures whose FLOPs `_flops` keeps (a sweep repeats a few hundred per batch)."""
_kept_flops: dict[tuple[Any, ...], int] = {}


def _frozen(value: Any) -> Any:
    """`value` as a hashable key that tells lists from tuples (a shape is a tuple)."""
    if type(value) is list:
        return (list, tuple(map(_frozen, value)))
    if type(value) is tuple:
        return (tuple, tuple(map(_frozen, value)))
    return value


def _flops(formula: Callable[..., int], args: tuple, kwargs: dict, out: Any) -> int:
    """FLOPs by a flop_registry formula. The registry wraps each formula to map every argument
    to its shape with pytree (`shape_wrapper`); mapping only the levels aten operators use, and
    calling the formula underneath, halves the cost. Without that wrapper, call it as it is.
    A formula reads only shapes and plain values, so equal ones give the same FLOPs: each
    signature's are kept, since every probe of a sweep dispatches the same operators."""
    inner = getattr(formula, "__wrapped__", None)
    if inner is None:
        return int(formula(*args, **kwargs, out_val=out))
    shaped_args = tuple(map(_shape, args))
    shaped = {k: _shape(v) for k, v in kwargs.items()}
    out_shape = _shape(out)
    key = (inner, _frozen((shaped_args, tuple(shaped.items()), out_shape)))
    keep = True
    try:
        return _kept_flops[key]
    except KeyError:
        pass
    except TypeError:
        keep = False  # an argument that cannot be a key: count it every time
    try:
        flops = int(inner(*shaped_args, out_shape=out_shape, **shaped))
    except AssertionError:
        # Before 2.13 the attention formulas assert as many key/value heads as query heads;
        # grouped-query attention broadcasts them, which is how 2.13's formulas count it.
        flops = int(inner(*_heads_expanded(shaped_args), out_shape=out_shape, **shaped))
    if keep:
        if len(_kept_flops) >= _FLOPS_KEPT:
            _kept_flops.clear()
        _kept_flops[key] = flops
    return flops


def _heads_expanded(shapes: tuple[Any, ...]) -> tuple[Any, ...]:
    """`shapes` with every 4-D shape's head dimension (dim 1) raised to the most heads among
    them, where it divides: key and value of grouped-query attention, counted as broadcast."""
    four_d = [s for s in shapes if isinstance(s, torch.Size) and len(s) == 4]
    heads = max((s[1] for s in four_d), default=0)

    def expand(s: Any) -> Any:
        if isinstance(s, torch.Size) and len(s) == 4 and s[1] and heads % s[1] == 0:
            return torch.Size((s[0], heads, s[2], s[3]))
        return s

    return tuple(map(expand, shapes))


OpWork = tuple[int, int, int]
"""One operator's (FLOPs, bytes moved, the rate its FLOPs run at: one of the `RATE_` kinds).
The kind, not the rate, so the same work costs right on any GPU."""

RATE_NONE, RATE_HALF, RATE_CONV_FP32, RATE_FP32 = range(4)
"""No FLOP formula; bf16/fp16; an fp32 convolution; other fp32 work (`Roofline`'s fields)."""


_NO_WORK: OpWork = (0, 0, RATE_NONE)


class WorkCounter:
    """FLOPs, bytes moved and roofline seconds of every operator it is shown.

    With `ops` set to a list, it also keeps each operator's parts there, in order, one entry
    per operator (zeros for one that launches no kernel): what the
    symbolic sweep reads a step's work at another batch size from
    (memorymark/accounting/symbolic.py), each operator's FLOPs and bytes being polynomials of
    the batch and its rate kind a constant.
    """

    __slots__ = ("roofline", "flops", "bytes_moved", "roofline_seconds", "ops", "_rates")

    def __init__(self, roofline: Roofline) -> None:
        self.roofline = roofline
        self.flops = 0
        self.bytes_moved = 0
        self.roofline_seconds = 0.0
        self.ops: list[OpWork] | None = None
        """(FLOPs, bytes moved, rate kind) of each operator added, when a list (kept)."""
        self._rates = (
            0.0,
            roofline.half_flops_per_s,
            roofline.conv_fp32_flops_per_s,
            roofline.fp32_flops_per_s,
        )

    def count(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> None:
        """Add one operator: `func(*args, **kwargs)` returned `out`."""
        work = work_of(func, args, kwargs, out)
        if work is not None:
            self.add(*work)
        elif self.ops is not None:
            # Kept per operator, kernel or not, as the tracker's timeline is: a step's parts
            # then line up with its operators (memorymark/accounting/depth.py).
            self.ops.append(_NO_WORK)

    def add_all(self, ops: Iterable[OpWork]) -> None:
        """Add recorded operators' work, one by one as `count` adds it (a float sum depends on
        its order)."""
        for work in ops:
            self.add(*work)

    def add(self, flops: int, nbytes: int, rate: int) -> None:
        """Add one operator's work: max(FLOPs at its kind's peak rate, bytes at the
        bandwidth)."""
        seconds = nbytes / self.roofline.bytes_per_s
        if rate:
            seconds = max(seconds, flops / self._rates[rate])
            self.flops += flops
        self.bytes_moved += nbytes
        self.roofline_seconds += seconds
        if self.ops is not None:
            self.ops.append((flops, nbytes, rate))

    @property
    def step_seconds(self) -> float:
        """The estimated step time: the roofline sum over the efficiency factor."""
        return self.roofline_seconds / EFFICIENCY


def work_of(func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> OpWork | None:
    """(FLOPs, bytes moved, the kind of rate its FLOPs run at) of one operator, or None when
    it launches no kernel."""
    packet = getattr(func, "_overloadpacket", None)
    if packet is None or func.is_view or packet in _NO_KERNEL:
        return None  # a view moves no data; nor does reserving memory
    outs = out if isinstance(out, (list, tuple)) else (out,)
    in_bytes, dtype = _tensor_bytes(args)
    out_bytes, out_dtype = _tensor_bytes(outs)
    formula = flop_registry.get(packet)
    if formula is None:
        return 0, in_bytes + out_bytes, RATE_NONE
    dtype = dtype or out_dtype
    if dtype in _HALF:
        rate = RATE_HALF
    elif packet in _CONVOLUTIONS:
        rate = RATE_CONV_FP32
    else:
        rate = RATE_FP32
    return _flops(formula, args, kwargs, out) // _split_over(outs), in_bytes + out_bytes, rate


def count_work(run: Callable[[], object], roofline: Roofline) -> WorkCounter:
    """The work of everything `run` dispatches (for tests and one-off estimates)."""
    counter = WorkCounter(roofline)
    tracker = MemoryTracker()
    tracker.work_counter = counter
    with tracker:
        run()
    return counter


def time_step(
    run_step: Callable[[], object],
    synchronize: Callable[[], object],
    *,
    steps: int = 3,
    warmup: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Median wall-clock seconds of `steps` runs of `run_step`, after `warmup` untimed runs.

    Kernels are queued asynchronously, so the device is synchronised before the clock starts
    and before it stops; the warm-up pays for cuBLAS handles, kernel loading and the caching
    allocator's first segments, which later steps reuse.
    """
    if steps < 1:
        raise ValueError(f"steps must be at least 1 (got {steps})")
    for _ in range(warmup):
        run_step()
    synchronize()
    seconds = []
    for _ in range(steps):
        start = clock()
        run_step()
        synchronize()
        seconds.append(clock() - start)
    return statistics.median(seconds)


def samples_per_second(batch_size: int, step_seconds: float | None) -> float | None:
    """Throughput of a step that trains `batch_size` samples in `step_seconds`."""
    if step_seconds is None or step_seconds <= 0:
        return None
    return batch_size / step_seconds
