"""Backends: one batch size in, one `Measurement` out.

Owns running a training step at one batch size, tracked and OOM-safe (`base`), resolving which
backend and which GPU a `Settings` means (`resolve`), the real devices (CUDA, MPS, CPU), the
simulation on fake tensors (`sim`), many GPUs simulated with PyTorch's own distributed code
(`dist_sim`, `sharding`) or run for real under torchrun (`torchrun`), recognising an
out-of-memory error (`oom`), the bytes of a model's states counted without a step (`states`),
and a user's setup code run as on the GPU it is sized for (`target_gpu`, behind the torch-free
`memorymark.target_gpu` in `target`). The only package that asks torch which accelerator this
machine has.

Must not know: which batch sizes are tried, what a report says, or how anything is shown.
"""
