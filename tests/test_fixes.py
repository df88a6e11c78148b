"""When nothing fits, each candidate change comes with its simulated batch-1 peak."""

from memorymark import gpus
from memorymark.fixes import simulated_peak, what_would_fit
from memorymark.settings import Settings


def test_each_fix_says_how_far_off_it_is():
    settings = Settings(model="tiny-bert", seq_len=128, gpu_memory_gib=1, margin="49%")
    base = simulated_peak(settings)
    fixes = {f.label: f for f in what_would_fit(settings)}
    assert {"gradient checkpointing", "LoRA rank 16", "all three together"} <= set(fixes)
    lora = fixes["LoRA rank 16"]
    assert lora.peak_bytes < base  # no gradients or optimizer state for frozen weights
    assert lora.settings.lora_rank == 16
    assert all(f.capacity_bytes > 0 for f in fixes.values())


def test_the_bigger_gpu_is_the_smallest_catalog_gpu_that_fits():
    # BERT-base with AdamW needs ~1.7 GiB at batch 1: more than a 1.5 GiB GPU, less than a T4.
    fixes = what_would_fit(Settings(model="bert", seq_len=128, gpu_memory_gib=1.5))
    bigger = [f for f in fixes if f.label.startswith("a bigger GPU")]
    smallest = min(gpus.CATALOG, key=lambda g: g.usable_bytes)
    assert [f.gpu.name for f in bigger] == [smallest.name]
    assert bigger[0].fits
    assert bigger[0].settings.gpu == smallest.name
