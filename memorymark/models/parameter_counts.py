"""The catalog's parameter counts, counted once and shipped, so listing models needs no torch.

Counting a model means building it (on the meta device: no memory, but torch and transformers
load, about 20 s on a 2-core machine before the first count). `memorymark models` and the app's
model box only show the figure, so the catalog's counts are kept here, per (key, task): each task
has its own head (a causal LM's output layer, a classifier's two labels). Counted with
transformers 5.24.0 and torch 2.13.0 by `python benchmarks/parameter_counts.py`, which prints
the table again after an upgrade; tests/test_cli_catalogs.py rebuilds a sample of
them and checks each against this table.
Must not know how a model is built: that is memorymark/models/catalog.py's.
"""

from __future__ import annotations

PARAMETERS: dict[tuple[str, str], int] = {
    ("bert", "sequence-classification"): 109_483_778,
    ("gpt2", "causal-lm"): 124_439_808,
    ("gpt2", "sequence-classification"): 124_441_344,
    ("resnet", "image-classification"): 25_557_032,
    ("distilbert", "sequence-classification"): 66_955_010,
    ("roberta", "sequence-classification"): 124_647_170,
    ("bert-large", "sequence-classification"): 335_143_938,
    ("gpt2-medium", "causal-lm"): 354_823_168,
    ("gpt2-medium", "sequence-classification"): 354_825_216,
    ("t5-small", "seq2seq-lm"): 60_506_624,
    ("vit", "image-classification"): 86_567_656,
    ("convnext", "image-classification"): 28_589_128,
    ("efficientnet", "image-classification"): 5_288_548,
    ("qwen2.5-0.5b", "causal-lm"): 494_032_768,
    ("qwen2.5-0.5b", "sequence-classification"): 494_034_560,
    ("llama-3.2-1b", "causal-lm"): 1_235_814_400,
    ("llama-3.2-1b", "sequence-classification"): 1_235_818_496,
    ("mistral-7b", "causal-lm"): 7_241_732_096,
    ("mistral-7b", "sequence-classification"): 7_110_668_288,
    ("llama-3.1-8b", "causal-lm"): 8_030_261_248,
    ("llama-3.1-8b", "sequence-classification"): 7_504_932_864,
    ("llama-3.1-70b", "causal-lm"): 70_553_706_496,
    ("llama-3.1-70b", "sequence-classification"): 69_503_049_728,
    ("qwen3-8b", "causal-lm"): 8_190_735_360,
    ("qwen3-8b", "sequence-classification"): 7_568_413_696,
    ("gemma-3-1b", "causal-lm"): 999_885_952,
    ("gemma-3-1b", "sequence-classification"): 999_888_256,
    ("qwen3-30b-a3b", "causal-lm"): 30_532_122_624,
    ("qwen3-30b-a3b", "sequence-classification"): 30_220_961_792,
    ("tiny-bert", "sequence-classification"): 54_434,
    ("tiny-gpt2", "causal-lm"): 61_568,
    ("tiny-gpt2", "sequence-classification"): 61_632,
    ("tiny-llama", "causal-lm"): 1_122_624,
    ("tiny-llama", "sequence-classification"): 598_464,
    ("tiny-resnet", "image-classification"): 3_602,
}
"""Parameters of each catalog model (key, task), all of them trainable in a full fine-tune."""
