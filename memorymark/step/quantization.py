"""Base weights stored as bitsandbytes stores them: 4-bit NF4/FP4 (QLoRA) or LLM.int8().

Each `nn.Linear` of the model except the output head (transformers' `get_keys_to_not_convert`
keeps it in full precision) becomes a subclass of bitsandbytes' own `Linear4bit` / `Linear8bitLt`.
The quantization is bitsandbytes' own (`functional.quantize_4bit`, `int8_vectorwise_quant`), run
on the meta device in a simulation (its ops have fake/meta kernels, bitsandbytes/_ops.py), so an
8B model is never materialised, and the forward and backward are bitsandbytes' own autograd
functions (`MatMul4Bit`, `MatMul8bitLt`), which dequantize the weight transiently.

What is emulated, and why: bitsandbytes keeps the quantization state on the weight
(`Params4bit.quant_state`, `Int8Params.SCB`), and a `Params4bit` cannot wrap a fake tensor
(`torch.Tensor._make_subclass` refuses a FakeTensor). So the packed weight is a plain frozen
parameter and the state's tensors are registered as buffers: they count as weights, become fake
with the rest of the model, and are handed to bitsandbytes as the `QuantState` it would hold.
The storage is exactly bitsandbytes': 4-bit, `(out*in+1)//2` uint8 bytes, absmax fp32 per
64-weight block, or with double quant absmax uint8 plus an fp32 absmax per 256 of them, the
256-entry code and an fp32 offset; int8, `out*in` int8 bytes plus one fp32 row scale (SCB).

This module knows nothing about measurement or devices; it imports bitsandbytes only when a
model is quantized, so settings and snippets can name the methods without it.
"""

from __future__ import annotations

import functools
import logging
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    import torch
    from torch import nn


class _NoCpuKernelNotice(logging.Filter):
    """Drops one bitsandbytes notice, and only that one: on a CPU with AVX512-BF16, importing
    bitsandbytes (which `import peft` and transformers' Trainer do) tries to download a CPU 4-bit
    inference kernel from the hub and logs "Failed to load CPU gemm_4bit_forward from
    kernels-community: ..." when it cannot (bitsandbytes 0.50 backends/cpu/ops.py). It printed on
    every command, yet says nothing about the step sized: the simulation never runs bitsandbytes'
    CPU kernels, and without that kernel bitsandbytes' own CPU path still computes the same
    result. Every other record of that logger passes."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(CPU_KERNEL_NOTICE)


CPU_KERNEL_NOTICE = "Failed to load CPU gemm_4bit_forward"
"""The start of the notice `_NoCpuKernelNotice` drops (bitsandbytes 0.50 backends/cpu/ops.py)."""

# Attached when this module is imported, which memorymark/__init__.py does first of all so the
# filter is in place before anything imports bitsandbytes (the logger object is the same before
# and after bitsandbytes creates it).
logging.getLogger("bitsandbytes.backends.cpu.ops").addFilter(_NoCpuKernelNotice())
# For each int8 matmul bitsandbytes warns that inputs are cast to fp16: that is the simulated
# LLM.int8() step working as designed, once per layer per step.
logging.getLogger("bitsandbytes.autograd._functions").setLevel(logging.ERROR)

BLOCKSIZE_4BIT = 64
"""Weights per absmax in 4-bit: bitsandbytes functional.quantize_4bit's default (blocksize=None
-> 64), which transformers' bnb integration and Params4bit use."""
NESTED_BLOCKSIZE = 256
"""absmax values per second-level absmax with double quant (functional.quantize_4bit:
`quantize_blockwise(_absmax - offset, blocksize=256)`)."""
INT8_THRESHOLD = 0.0
"""LLM.int8()'s outlier threshold as simulated. transformers' default is 6.0
(BitsAndBytesConfig(llm_int8_threshold=6.0)): inputs' outlier columns then also run in fp16,
a submatrix whose width depends on the values (`int8_vectorwise_quant`'s fake kernel asks for a
data-dependent size, which fake tensors cannot give). 0.0 leaves that small submatrix out."""


def is_4bit(method: str) -> bool:
    """True for the 4-bit methods (nf4, fp4), which accept double quant."""
    return method in ("nf4", "fp4")


def quantized_weight_bytes(out_features: int, in_features: int, method: str, nested: bool) -> int:
    """Bytes bitsandbytes stores for one quantized `out x in` weight (packed data plus the
    per-layer state; the 256-entry double-quant code is shared and not counted here)."""
    n = out_features * in_features
    if method == "int8":
        return n + 4 * out_features  # int8 CB + fp32 SCB
    blocks = -(-n // BLOCKSIZE_4BIT)
    packed = (n + 1) // 2
    code = 16 * 4  # get_4bit_type: the 16-value NF4/FP4 table, fp32, one per QuantState
    if not nested:
        return packed + 4 * blocks + code
    return packed + blocks + 4 * -(-blocks // NESTED_BLOCKSIZE) + 4 + code


@functools.cache
def bitsandbytes_module() -> Any:
    """bitsandbytes, imported once; a clear error when it is not installed."""
    try:
        import bitsandbytes
        import bitsandbytes.functional as bnb_functional
    except ImportError as exc:  # pragma: no cover - requirements.txt installs it
        raise ValueError(
            f"quantization and 8-bit optimizers need bitsandbytes (pip install bitsandbytes): {exc}"
        ) from None
    # quantize_blockwise builds its 256-value code from real values (`.tolist()`), which the
    # meta device has none of; build it once on the CPU, as its cache `name2qmap` would.
    if "dynamic" not in bnb_functional.name2qmap:
        import torch

        with torch.device("cpu"):  # the caller may build on meta
            bnb_functional.name2qmap["dynamic"] = bnb_functional.create_dynamic_map()
    _register_flop_formulas()
    return bitsandbytes


def _register_flop_formulas() -> None:
    """FLOPs of bitsandbytes' fused matmuls for torch's flop counter (and so the throughput
    estimate), which knows only aten's: 2*M*N*K, as its formula for `mm`."""
    import torch
    from torch.utils.flop_counter import register_flop_formula

    def matmul_flops(
        a_shape: Any, b_shape: Any, *args: Any, out_shape: Any = None, **_: Any
    ) -> int:
        rows = 1
        for size in a_shape[:-1]:
            rows *= size
        return 2 * rows * a_shape[-1] * out_shape[-1]

    ops = torch.ops.bitsandbytes
    for op in (ops.gemm_4bit, ops.int8_scaled_mm, ops.int8_linear_matmul):
        register_flop_formula(op)(matmul_flops)


def _classes() -> tuple[type, type]:
    bnb = bitsandbytes_module()
    import torch
    from torch import nn

    linear_4bit: Any = bnb.nn.Linear4bit  # a class of a module imported at run time
    linear_8bit: Any = bnb.nn.Linear8bitLt

    class QuantizedLinear4bit(linear_4bit):
        """bitsandbytes' Linear4bit whose QuantState tensors are buffers (see module doc)."""

        def __init__(self, linear: nn.Module, quant_type: str, nested: bool, compute) -> None:
            weight = _out_by_in(linear)
            super().__init__(
                weight.shape[1],
                weight.shape[0],
                bias=linear.bias is not None,
                compute_dtype=compute,
                compress_statistics=nested,
                quant_type=quant_type,
                device="meta",
            )
            # The CPU-inference repacking (AVX512-BF16) never happens on the GPUs imitated.
            self.support_avx512bf16_for_cpu = False
            packed, state = bnb.functional.quantize_4bit(
                weight,
                blocksize=BLOCKSIZE_4BIT,
                compress_statistics=nested,
                quant_type=quant_type,
            )
            self.weight = nn.Parameter(packed, requires_grad=False)
            self.bias = linear.bias
            self._shape, self._dtype, self._nested = state.shape, state.dtype, nested
            self._quant_type = quant_type
            self.register_buffer("absmax", state.absmax)
            self.register_buffer("code", state.code)
            if nested:
                self.register_buffer("offset", state.offset)
                self.register_buffer("absmax2", state.state2.absmax)
                self.register_buffer("code2", state.state2.code)
            self._describe_weight()

        def packed_state(self) -> Any:
            """The QuantState bitsandbytes would keep on `weight`, over this module's buffers."""
            qs = bnb.functional.QuantState
            nested = None
            if self._nested:
                # quantize_blockwise's state: the absmax it quantized was fp32.
                nested = qs(
                    absmax=self.absmax2,
                    code=self.code2,
                    blocksize=NESTED_BLOCKSIZE,
                    dtype=self.absmax2.dtype,
                )
            return qs(
                absmax=self.absmax,
                shape=self._shape,
                code=self.code,
                blocksize=BLOCKSIZE_4BIT,
                quant_type=self._quant_type,
                dtype=self._dtype,
                offset=self.offset if nested is not None else None,
                state2=nested,
            )

        def _describe_weight(self) -> None:
            # What Params4bit carries and bitsandbytes and peft's LoRA layer read off it; set
            # again at each forward, since the simulation swaps the parameter for a fake one.
            weight: Any = self.weight  # Params4bit's attributes, set on the fake stand-in
            weight.quant_state = self.packed_state()
            weight.compress_statistics = self._nested
            weight.quant_type = self._quant_type
            weight.blocksize = BLOCKSIZE_4BIT

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            self._describe_weight()
            absmax = self.absmax if self._nested else None
            dtype = self.compute_dtype or x.dtype  # what Linear4bit.forward casts x to
            scratch = gemm_scratch(x, dtype, tuple(self._shape), absmax)
            out = super().forward(x)
            del scratch
            return out

    class QuantizedLinear8bitLt(linear_8bit):
        """bitsandbytes' Linear8bitLt whose row scales (SCB) are a buffer (see module doc)."""

        def __init__(self, linear: nn.Module) -> None:
            weight = _out_by_in(linear)
            super().__init__(
                weight.shape[1],
                weight.shape[0],
                bias=linear.bias is not None,
                has_fp16_weights=False,
                threshold=INT8_THRESHOLD,
                device="meta",
            )
            # Int8Params.cuda: `int8_vectorwise_quant(B.to(torch.float16))` (nn/modules.py).
            cb, scb, _ = bnb.functional.int8_vectorwise_quant(weight.half())
            self.weight = nn.Parameter(cb, requires_grad=False)
            self.bias = linear.bias
            self.register_buffer("SCB", scb)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            # Linear8bitLt.forward after init_8bit_state: the state holds CB and SCB.
            self.state.is_training = self.training
            self.state.CB, self.state.SCB = self.weight, self.SCB
            if self.bias is not None and self.bias.dtype != x.dtype:
                self.bias.data = self.bias.data.to(x.dtype)
            # MatMul8bitLt, as on CUDA: bnb.matmul would take MatMul8bitFp for CPU tensors in
            # training (autograd/_functions.py `matmul`), which the GPUs imitated never run.
            lt = bnb.autograd._functions.MatMul8bitLt
            return lt.apply(x, self.weight, None, self.bias, self.state)

    del torch
    return QuantizedLinear4bit, QuantizedLinear8bitLt


@functools.cache
def quantized_classes() -> tuple[type, type]:
    """(4-bit, 8-bit) module classes; built once, at first use (importing bitsandbytes)."""
    return _classes()


def gemm_scratch(
    x: torch.Tensor, dtype: torch.dtype, weight_shape: tuple[int, int], absmax: Any
) -> list[Any]:
    """Temporaries bitsandbytes' 4-bit matmul allocates beside its output for input `x` (cast
    to the compute `dtype`): none as its ops run here; `cuda_rules.bnb_gemm` gives CUDA's while
    a simulated step runs."""
    return []


def _out_by_in(layer: nn.Module) -> torch.Tensor:
    # GPT-2's Conv1D stores its weight (in, out); transformers' bnb integration quantizes it
    # transposed, as nn.Linear's (out, in).
    weight = cast("torch.Tensor", layer.weight).detach()
    return weight.t().contiguous() if type(layer).__name__ == "Conv1D" else weight


def _is_quantizable(module: nn.Module) -> bool:
    from torch import nn

    return type(module) is nn.Linear or type(module).__name__ == "Conv1D"


def _kept_in_full_precision(model: nn.Module) -> set[str]:
    # transformers/integrations/bitsandbytes.py and quantizers: `get_keys_to_not_convert` keeps
    # the output embedding (lm_head) and tied weights unquantized.
    try:
        from transformers.quantizers.base import get_keys_to_not_convert
    except ImportError:  # older layout
        from transformers.integrations import (  # type: ignore[attr-defined,no-redef]
            get_keys_to_not_convert,
        )
    # The quantizer also leaves the model's `_keep_in_fp32_modules` (T5's `wo`) unconverted
    # (transformers/quantizers/base.py `get_modules_to_not_convert`).
    kept = getattr(model, "_keep_in_fp32_modules", None) or []
    return set(get_keys_to_not_convert(model)) | set(kept)


def quantize(model: nn.Module, method: str, double_quant: bool, compute_dtype: Any) -> nn.Module:
    """Replace `model`'s linear layers (all but the output head) with bitsandbytes' quantized
    ones, in place, then prepare it as peft's `prepare_model_for_kbit_training` does (every
    parameter frozen, the remaining fp16/bf16 ones cast to fp32). Gradient checkpointing is
    left to the caller. Returns the model."""
    if method == "none":
        return model
    four_bit, eight_bit = quantized_classes()
    keep = _kept_in_full_precision(model)
    targets = [
        (name, module)
        for name, module in model.named_modules()
        if _is_quantizable(module) and not any(_matches(name, k) for k in keep)
    ]
    for name, linear in targets:
        if is_4bit(method):
            new = four_bit(linear, method, double_quant, compute_dtype)
        else:
            new = eight_bit(linear)
        parent, _, child = name.rpartition(".")
        setattr(model.get_submodule(parent) if parent else model, child, new)
    _share_nested_code(model, four_bit)
    setattr(model, "is_loaded_in_4bit" if is_4bit(method) else "is_loaded_in_8bit", True)
    from peft import prepare_model_for_kbit_training

    # use_gradient_checkpointing=False: the workload turns checkpointing on itself, non-reentrant
    # (peft's own default path would also call enable_input_require_grads, which only the
    # reentrant variant needs).
    return prepare_model_for_kbit_training(model, use_gradient_checkpointing=False)


def _share_nested_code(model: nn.Module, four_bit: type) -> None:
    # On CUDA every QuantState's second-level code is the one tensor bitsandbytes caches per
    # device (functional.py `name2qmap["dynamic"]`); copied to the meta device, each layer got
    # its own. Share one, as the GPU would.
    layers = [m for m in model.modules() if isinstance(m, four_bit) and m._nested]
    for layer in layers[1:]:
        layer.code2 = layers[0].code2


def _matches(name: str, key: str) -> bool:
    return name == key or name.endswith("." + key) or key.startswith(name + ".")


def quantized_bytes(model: nn.Module) -> int:
    """Bytes of the quantized layers' weights and state (packed data, absmax, code, SCB)."""
    classes = quantized_classes() if _bnb_loaded() else ()
    seen: set[int] = set()
    total = 0
    for module in model.modules():
        if classes and isinstance(module, classes):
            for t in [cast("torch.Tensor", module.weight), *module.buffers(recurse=False)]:
                storage = t.untyped_storage()
                if id(storage) not in seen:
                    seen.add(id(storage))
                    total += storage.nbytes()
    return total


def _bnb_loaded() -> bool:
    import sys

    return "bitsandbytes" in sys.modules
