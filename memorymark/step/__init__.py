"""The training step: what one step of training is, apart from how its memory is measured.

Owns the step's protocol (build the model, build the optimizer(s), make a batch of size N, prime
the optimizer state, run one loop step), the catalog's step built from `Settings` (`catalog`),
and what changes a step: optimizers, adapters (LoRA, checkpointing), quantization, fused losses,
Liger's kernels, paged optimizer state.

Must not know: how memory is counted or replayed, which batch sizes are tried, or how anything is
shown. Backends take any step that follows the protocol.
"""
