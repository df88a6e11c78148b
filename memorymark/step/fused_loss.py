"""Causal-LM losses that never hold the whole vocabulary's logits at once, as their libraries do.

A causal LM's last layer turns every token's hidden state into one score per vocabulary entry:
batch x seq x vocab logits (Llama 3: 128,256 entries), which transformers' loss then upcasts to
fp32. At long context that is the largest tensor of the step. Two ways out, each run here as the
library runs it, on whatever tensors the step uses (fake ones in the simulation):

- Liger's fused linear cross-entropy (`--kernels liger`; liger-kernel
  src/liger_kernel/ops/fused_linear_cross_entropy.py, `fused_linear_cross_entropy_forward`,
  read at commit 00eba634): the tokens are cut into chunks of
  `next_power_of_2(ceil(BT / ceil(V / H)))` rows (capped at BT), so a chunk's logits are about as
  large as the hidden states; each chunk's logits are computed, turned into their gradient in
  place by the Triton kernel, and multiplied back into `grad_input` (and `grad_weight` when the
  output layer trains) during the forward. Forward saves those gradients, never the logits.
- Chunked cross-entropy (`--loss-chunks N`; torchtune's `CEWithChunkedOutputLoss` and its
  decoders' `num_output_chunks`): the output layer runs on N slices of the sequence and each
  slice's logits are upcast to fp32 and cross-entropied on their own, so the fp32 copy of the
  whole logits never exists at once (the bf16 logits and the log-probabilities backward needs
  are still kept).

`use_fused_loss(model, ...)` swaps a causal LM's forward for one that computes the hidden states
with the model's own decoder and the loss with one of these, as Liger's `lce_forward` does. This
module knows nothing about measurement or devices.
"""

from __future__ import annotations

import types
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

IGNORE_INDEX = -100
"""transformers' and Liger's label for tokens that carry no loss (the shifted-out last one)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _next_power_of_2(n: int) -> int:
    return 1 << (n - 1).bit_length()


def liger_chunk_size(tokens: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of Liger's fused linear cross-entropy (chunk_mem_const 1)."""
    inc_factor = _cdiv(vocab, hidden)
    return min(_next_power_of_2(_cdiv(tokens, inc_factor)), tokens)


def _uses_mm_out(x: torch.Tensor, weight: torch.Tensor) -> bool:
    # `_can_use_mm_out`: the logits go into one reused buffer unless autocast would change the
    # matmul's dtype (grad mode is off inside an autograd Function's forward).
    if x.dtype != weight.dtype or x.dtype not in (torch.float16, torch.bfloat16, torch.float32):
        return False
    if torch.is_autocast_enabled("cpu"):
        return x.dtype == torch.get_autocast_dtype("cpu")
    return True


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Liger's `LigerFusedLinearCrossEntropyFunction`: gradients computed in forward, chunk by
    chunk; the Triton kernel's in-place work allocates nothing and is left out."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor
    ) -> torch.Tensor:
        tokens, hidden = x.shape
        chunk = liger_chunk_size(tokens, weight.shape[0], hidden)
        # Gradients only when the input needs them (`input_requires_grad`): not under no_grad.
        wants_grad = ctx.needs_input_grad[0]
        grad_input = torch.zeros_like(x) if wants_grad else None
        grad_weight = torch.zeros_like(weight) if wants_grad and ctx.needs_input_grad[1] else None
        loss_1d = torch.zeros(tokens, dtype=torch.float32, device=x.device)
        non_ignored = (target != IGNORE_INDEX).sum()  # Liger reads it back with .item()
        mm_out = _uses_mm_out(x, weight)
        storage = torch.empty((chunk, weight.shape[0]), dtype=x.dtype) if mm_out else None
        for start in range(0, tokens, chunk):
            end = min(start + chunk, tokens)
            x_chunk = x[start:end]
            if storage is not None:
                logits = storage[: end - start]
                torch.mm(x_chunk, weight.t(), out=logits)
            else:
                logits = (x_chunk @ weight.t()).contiguous()
            # The kernel writes the loss into loss_1d and the logits' gradient over the logits.
            if grad_input is not None and storage is not None:
                torch.mm(logits, weight, out=grad_input[start:end])
            elif grad_input is not None:
                grad_input[start:end] = logits @ weight
            if grad_weight is not None:
                grad_weight.addmm_(logits.t(), x_chunk)
            del logits
        del storage
        saved = [t for t in (grad_input, grad_weight) if t is not None]
        ctx.save_for_backward(*saved)
        ctx.has_weight_grad = grad_weight is not None
        return loss_1d.sum() / non_ignored

    @staticmethod
    def backward(ctx: Any, grad_output: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        saved = ctx.saved_tensors
        # Liger scales the saved gradients in place by grad_output (element_mul_kernel).
        return saved[0], (saved[1] if ctx.has_weight_grad else None), None


def liger_loss(hidden: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor) -> torch.Tensor:
    """`LigerForCausalLMLoss`: shift the labels, flatten, fused linear cross-entropy."""
    labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:].contiguous()
    hidden = hidden.reshape(-1, hidden.shape[-1])
    return _FusedLinearCrossEntropy.apply(hidden, lm_head.weight, labels.view(-1))


def chunked_loss(
    hidden: torch.Tensor, lm_head: nn.Module, labels: torch.Tensor, chunks: int
) -> torch.Tensor:
    """torchtune: the output layer per sequence chunk (`num_output_chunks`), then
    `CEWithChunkedOutputLoss`: each chunk upcast to fp32 and cross-entropied (sum), / tokens."""
    labels = F.pad(labels[..., 1:], (0, 1), value=IGNORE_INDEX)  # the recipes shift this way
    logits = [lm_head(part) for part in hidden.chunk(chunks, dim=1)]
    total_elements = (labels != IGNORE_INDEX).sum()
    label_chunks = [part.reshape(-1) for part in labels.chunk(chunks, dim=1)]
    total = None
    for chunk_logits, chunk_labels in zip(logits, label_chunks, strict=True):
        flat = chunk_logits.reshape(-1, chunk_logits.size(-1))
        loss = F.cross_entropy(
            flat.float(), chunk_labels, ignore_index=IGNORE_INDEX, reduction="sum"
        )
        total = loss if total is None else total + loss
    assert total is not None, "chunks >= 1 gives one loss at least"
    return total / total_elements


def use_fused_loss(model: nn.Module, *, liger: bool, chunks: int) -> None:
    """Make `model` (a transformers causal LM) compute its training loss with Liger's fused
    linear cross-entropy (`liger`) or in `chunks` chunks, as `lce_forward` / torchtune do:
    no logits are returned while training with labels. ValueError if the model has no decoder
    (`get_decoder()`) under an output layer."""
    decoder = _called(model, "get_decoder")
    head = _called(model, "get_output_embeddings")
    if decoder is model or not isinstance(decoder, nn.Module) or not isinstance(head, nn.Linear):
        raise ValueError(
            f"{type(model).__name__} has no decoder under a linear output layer: the fused "
            "loss needs a causal LM like Llama's"
        )
    from transformers.modeling_outputs import CausalLMOutputWithPast

    def forward(
        self: nn.Module,
        input_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        **kwargs: Any,
    ) -> CausalLMOutputWithPast:
        kwargs.pop("logits_to_keep", None)
        kwargs.pop("num_items_in_batch", None)
        hidden = decoder(input_ids=input_ids, **kwargs).last_hidden_state
        if labels is None or not self.training:
            return CausalLMOutputWithPast(logits=head(hidden))
        if liger:
            loss = liger_loss(hidden, head, labels)
        else:
            loss = chunked_loss(hidden, head, labels, chunks)
        return CausalLMOutputWithPast(loss=loss, logits=None)

    model.forward = types.MethodType(forward, model)


def _called(model: nn.Module, method: str) -> object:
    """`model.method()` where the model has that method (transformers' models do), else None."""
    bound = getattr(model, method, None)
    return bound() if callable(bound) else None
