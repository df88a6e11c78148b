"""When nothing fits, each candidate change comes with its simulated batch-1 peak."""

from dataclasses import replace

from memorymark import Session, gpus
from memorymark.analyses import fixes as fixes_module
from memorymark.analyses.bench import Bench
from memorymark.analyses.fixes import simulated_step
from memorymark.backends.states import counted_states
from memorymark.fit import FitPolicy
from memorymark.measurement import Measurement
from memorymark.settings import Settings


def what_would_fit(settings, batch_1=None, *, bench=None):
    """The ways out, through the door a Session hands the search (`bench`, else its own)."""
    bench = bench or Session(settings).bench
    return fixes_module.WaysOutSearch(settings, batch_1, bench=bench).answer()


class CountingBench:
    """A session's bench that notes each step it measures: (settings, GPU name)."""

    def __init__(self, settings: Settings) -> None:
        self.real: Bench = Session(settings).bench
        self.stepped: list[tuple[Settings, str]] = []

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)

    def measure(self, settings: Settings, gpu: gpus.GPU, batch_size: int = 1) -> Measurement:
        self.stepped.append((settings, gpu.name))
        return self.real.measure(settings, gpu, batch_size)


def test_each_fix_says_how_far_off_it_is():
    settings = Settings(model="tiny-bert", seq_len=128, gpu_memory_gib=1, margin="49%")
    answer = what_would_fit(settings)
    base = simulated_step(Session(settings).bench, settings, gpus.custom_gpu(1))
    assert answer.required_bytes == base.required_bytes
    fixes = {f.label: f for f in answer.fixes}
    together = "gradient checkpointing + bf16-true + LoRA rank 16 together"
    assert {"gradient checkpointing", "LoRA rank 16", together} <= set(fixes)
    assert fixes[together].settings == settings.replace(
        grad_checkpointing=True, precision="bf16-true", lora_rank=16
    )
    lora = fixes["LoRA rank 16"]
    # No gradients or optimizer state for frozen weights (reserved bytes of a model this small
    # are one 2 MiB allocator segment either way, so compare live bytes).
    assert lora.peak_bytes < base.peak_bytes
    assert lora.required_bytes >= lora.peak_bytes
    assert lora.settings.workload.lora_rank == 16
    assert all(f.limit_bytes > 0 for f in fixes.values())


def test_the_bigger_gpu_is_the_cheapest_catalog_gpu_that_fits(monkeypatch):
    # Every catalog GPU holds tiny-bert: the cheapest wins, not the smallest (T4) or biggest.
    by_name = {g.name: g for g in gpus.CATALOG}
    priced = (
        replace(by_name["T4"], usd_per_hour=9.0),
        replace(by_name["L4"], usd_per_hour=0.5),
        replace(by_name["H200"], usd_per_hour=0.7),
    )
    monkeypatch.setattr(gpus, "CATALOG", priced)
    answer = what_would_fit(Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1))
    bigger = [f for f in answer.fixes if f.label == "a bigger GPU"]
    assert [f.gpu.name for f in bigger] == ["L4"]
    assert bigger[0].fits and bigger[0].settings.hardware.gpu == "L4"
    assert bigger[0].title == "a bigger GPU: L4"  # the GPU named once


def test_no_bf16_fix_is_offered_on_a_gpu_without_bf16():
    from memorymark import gpus
    from memorymark.analyses.changes import settings_changes

    s = Settings(model="tiny-bert", gpu="t4")
    labels = [label for label, _ in settings_changes(s, gpus.find_gpu("t4"))]
    assert "bf16-true weights and optimizer" not in labels
    assert all(
        not v.workload.precision.startswith("bf16")
        for _, v in settings_changes(s, gpus.find_gpu("t4"))
    )
    assert "bf16-true weights and optimizer" in [
        label for label, _ in settings_changes(s, gpus.find_gpu("a10"))
    ]


def test_qlora_and_8bit_adamw_are_offered_and_simulated():
    settings = Settings(model="tiny-bert", seq_len=128, gpu_memory_gib=1, margin="49%")
    fixes = {f.label: f for f in what_would_fit(settings).fixes}
    qlora = fixes["QLoRA: NF4 + LoRA + checkpointing"]
    assert (qlora.settings.workload.quantization, qlora.settings.workload.double_quant) == (
        "nf4",
        True,
    )
    assert qlora.settings.workload.lora_rank == 16 and qlora.settings.workload.grad_checkpointing
    assert not qlora.lower_bound  # stepped, not bounded
    eight_bit = fixes["8-bit AdamW (bitsandbytes)"]
    assert eight_bit.settings.workload.optimizer == "adamw-8bit"
    batch_1 = simulated_step(Session(settings).bench, settings, gpus.custom_gpu(1))
    assert eight_bit.peak_bytes < batch_1.peak_bytes


def test_what_the_states_alone_decide_is_not_stepped(monkeypatch):
    settings = Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1, margin="49%")
    states = counted_states(settings)[0]
    # The weights, gradients and AdamW's two buffers, all alive at the optimizer step, beside
    # the model's own buffers (BERT's int64 position and token type ids, 128 each).
    model_bytes = counted_states(settings.replace(optimizer="none"))[0]
    buffers = 2 * 128 * 8
    assert states == model_bytes + 3 * (model_bytes - buffers)
    bench = CountingBench(settings)
    # A limit below the states: every change whose states pass it is a bound, never a step.
    monkeypatch.setattr(fixes_module, "settings_changes", lambda s, gpu: [("checkpointing", s)])
    tiny = gpus.custom_gpu(1)
    monkeypatch.setattr(
        "memorymark.backends.selection.fit_policy",
        lambda s, gpu: FitPolicy(capacity_bytes=states, margin_bytes=states // 2),
    )
    answer = what_would_fit(settings, bench=bench)
    (fix, *_) = answer.fixes
    assert fix.lower_bound and fix.required_bytes == states and not fix.fits
    assert fix.to_dict()["at_least"] is True
    # Only batch 1 as configured (which no sweep handed in) on one GPU; many GPUs are stepped
    # where a rank's share of the states fits.
    simulated = settings.replace(backend="sim")
    assert [s for s, _ in bench.stepped if s.hardware.gpu_count == 1] == [simulated]
    assert tiny.usable_bytes > 0


def test_the_sweep_s_batch_1_is_not_stepped_again(monkeypatch):
    settings = Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1, margin="49%")
    custom = gpus.custom_gpu(1)
    bench = CountingBench(settings)
    batch_1 = simulated_step(bench, settings, custom)
    simulated = settings.replace(backend="sim")
    assert bench.stepped == [(simulated, custom.name)]
    monkeypatch.setattr(fixes_module, "settings_changes", lambda s, gpu: [])
    answer = what_would_fit(settings, batch_1, bench=bench)
    assert answer.required_bytes == batch_1.required_bytes
    # Other GPUs and counts get their own step; batch 1 here is not stepped again.
    assert bench.stepped.count((simulated, custom.name)) == 1


def test_a_change_that_needs_no_less_is_not_offered(monkeypatch):
    settings = Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1, margin="49%")
    # "Checkpointing" that changes nothing: the same settings under another label.
    monkeypatch.setattr(fixes_module, "settings_changes", lambda s, gpu: [("no change", s)])
    answer = what_would_fit(settings)
    assert all(fix.label != "no change" for fix in answer.fixes)


def test_the_combined_fix_names_only_what_it_changes_and_is_left_out_when_one_thing_does():
    # Already in bf16-true with LoRA: only checkpointing is left, listed on its own already.
    settings = Settings(
        model="tiny-bert", seq_len=128, gpu_memory_gib=1, precision="bf16-true", lora_rank=8
    )
    labels = [f.label for f in what_would_fit(settings).fixes]
    assert "gradient checkpointing" in labels
    assert not [label for label in labels if label.endswith("together")]
