"""Sizing the training code people already have: an HF `Trainer` (`hf`) or a Lightning
`LightningModule` (`lightning`), each turned into a `memorymark.Training` and sized by a Session,
for any catalog GPU, with no GPU. Each follows its library's conventions: where it reads the
batch size, the optimizer, the precision, and where it writes the answer back.

Must not know: how memory is counted or replayed, which batch sizes are tried, or how anything is
shown. Lightning is optional: importing `lightning` without it is one clear error.
"""
