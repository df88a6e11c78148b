"""Backends: the simulation equals real CPU execution, OOM is a result, and cleanup is complete."""

import dataclasses
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch

from memorymark import gpus
from memorymark.backends.device import CpuBackend, DeviceBackend
from memorymark.backends.oom import StepError
from memorymark.backends.resolve import resolve_backend_name
from memorymark.backends.sim import SimBackend
from memorymark.cuda_rules import versions
from memorymark.engine import Session
from memorymark.fit import FitPolicy
from memorymark.measurement import Category
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

BIG = 8 * 2**30

TINY = [
    Settings(model="tiny-bert", seq_len=32),
    Settings(model="tiny-gpt2", seq_len=32),
    Settings(model="tiny-gpt2", seq_len=32, task="sequence-classification"),
    Settings(model="tiny-resnet", image_size=32),
    Settings(model="tiny-bert", seq_len=32, optimizer="sgd"),
    Settings(model="tiny-bert", seq_len=32).with_protocol("inference-style"),
]


@pytest.mark.parametrize(
    "settings", TINY, ids=lambda s: f"{s.workload.model}-{s.workload.task}-{s.workload.optimizer}"
)
def test_sim_equals_real_cpu_execution(settings):
    # The cpu backend runs CPU's kernels; the simulation reproduces them with the CUDA rules off
    # (tests/test_cuda_rules.py checks each rule on its own).
    sim = SimBackend(
        CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG), cuda_rules=False
    ).measure(4)
    cpu = CpuBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(4)
    assert sim.fits and cpu.fits
    assert sim.peak_bytes == cpu.peak_bytes
    assert sim.breakdown == cpu.breakdown
    assert sim.breakdown.total == sim.peak_bytes


def _param_bytes(settings):
    model = CatalogStep(settings).build_model()
    return sum(p.numel() * p.element_size() for p in model.parameters())


def test_adamw_keeps_two_moments_and_sgd_one_buffer(tiny_bert):
    param_bytes = _param_bytes(tiny_bert)
    n_tensors = len(list(CatalogStep(tiny_bert).build_model().parameters()))
    adamw = (
        SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG))
        .measure(2)
        .breakdown
    )
    sgd_settings = replace(tiny_bert, optimizer="sgd")
    sgd = (
        SimBackend(CatalogStep(sgd_settings), policy=FitPolicy(capacity_bytes=BIG))
        .measure(2)
        .breakdown
    )
    none = (
        SimBackend(
            CatalogStep(replace(tiny_bert, optimizer="none")), policy=FitPolicy(capacity_bytes=BIG)
        )
        .measure(2)
        .breakdown
    )
    # AdamW: exp_avg + exp_avg_sq per parameter, plus a 4-byte step count per tensor.
    assert adamw.optimizer_state == 2 * param_bytes + 4 * n_tensors
    assert sgd.optimizer_state == param_bytes
    assert none.optimizer_state == 0
    assert adamw.parameters == sgd.parameters


def test_peak_grows_with_batch_and_activations_dominate_at_large_batch(tiny_bert):
    backend = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG))
    small, large = backend.measure(2), backend.measure(64)
    assert large.peak_bytes > small.peak_bytes
    assert large.breakdown.activations > large.breakdown.parameters


def test_a_step_past_the_capacity_says_what_it_needs_and_the_next_starts_afresh(tiny_bert):
    first = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG)).measure(8)
    unbounded = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG)).measure(64)
    # The capacity is what the GPU would need at batch 8: the allocator's predicted reserved bytes.
    backend = SimBackend(
        CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=first.required_bytes)
    )
    before = backend.measure(8)
    oom = backend.measure(64)
    after = backend.measure(8)
    assert before.fits and after.fits
    assert not oom.fits and not oom.runs
    # Traced to its end: it needs what batch 64 needs with no limit, and says so in one line.
    assert oom.required_bytes == unbounded.required_bytes > first.required_bytes
    assert oom.breakdown == unbounded.breakdown
    assert oom.error == (
        f"simulated out of memory: needs {oom.required_bytes / 2**20:.1f} MiB of "
        f"{first.required_bytes / 2**20:.1f} MiB"
    )
    assert oom.samples_per_second is None
    assert after.peak_bytes == before.peak_bytes == first.peak_bytes
    assert (
        backend._tracker.live_bytes
        == backend._tracker.peak_breakdown().parameters
        + (backend._tracker.live_by_category[Category.OPTIMIZER_STATE])
    )


def test_simulated_probes_predict_what_the_caching_allocator_holds(tiny_bert):
    backend = Session(tiny_bert).open_backend()
    m = backend.measure(8)
    # Rounding to 512-byte blocks adds a little; segments (2 MiB or more) add more.
    assert m.peak_bytes <= m.predicted_allocated_bytes < m.predicted_reserved_bytes
    assert m.predicted_reserved_bytes % (2 * 2**20) == 0
    assert m.required_bytes == m.predicted_reserved_bytes
    assert m.reserved_bytes is None  # nothing was measured


def test_the_simulated_oom_is_what_the_gpu_would_reserve(tiny_bert):
    # A capacity of exactly the live tensor bytes would hold the tensors, but not the segments
    # the caching allocator needs for them: a GPU would run out of memory.
    peak = (
        SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG))
        .measure(8)
        .peak_bytes
    )
    m = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=peak)).measure(8)
    assert not m.fits
    assert m.error.startswith("simulated out of memory: needs ")
    assert m.predicted_reserved_bytes == m.required_bytes > peak
    assert m.samples_per_second is None


def test_the_margin_separates_fits_from_runs(tiny_bert):
    need = (
        SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG))
        .measure(8)
        .required_bytes
    )
    inside = SimBackend(
        CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=need, margin_bytes=2**20)
    ).measure(8)
    assert inside.runs and not inside.fits  # it trains, but leaves less than the margin free
    assert inside.error is None


def test_a_step_that_runs_only_after_a_cache_flush_is_never_recommended(tiny_bert, monkeypatch):
    from memorymark.accounting import allocator
    from memorymark.backends import base as backend_module

    def retried(*args, **kwargs):
        return allocator.Prediction(1000, 2000, alloc_retries=1)

    monkeypatch.setattr(backend_module.allocator, "replay", retried)
    m = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG)).measure(8)
    assert m.alloc_retries == 1
    assert m.runs and not m.fits  # it trains, counts towards the maximum, is not recommended
    assert "retried 1 allocation(s): not recommended" in m.error


def test_the_device_s_allocation_retries_keep_a_step_from_being_recommended(tiny_bert):
    cuda = FakeCuda(retries=0)
    backend = DeviceBackend(
        CatalogStep(tiny_bert),
        policy=FitPolicy(capacity_bytes=BIG),
        name="cpu",
        device_module=cuda,
        peak_stats=True,
    )
    assert backend.measure(2).fits

    def retry_during_step(*args, **kwargs):
        cuda.retries += 2  # the counter is cumulative: only the step's own retries count

    backend.training_step = dataclasses.replace(backend.training_step)
    original = CatalogStep.run_step
    try:
        CatalogStep.run_step = lambda self, *a, **k: (original(self, *a, **k), retry_during_step())
        m = backend.measure(2)
    finally:
        CatalogStep.run_step = original
    assert m.alloc_retries == 2
    assert m.runs and not m.fits
    assert m.memory_stats["num_alloc_retries"] == 2


def test_the_cublas_workspaces_are_served_by_the_allocator_before_the_step(tiny_bert):
    plain = Session(tiny_bert).open_backend()
    bare = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG)).measure(8)
    with_ws = plain.measure(8)
    a10 = gpus.find_gpu("a10")
    # Allocated counts the live workspaces; the tensors' own peak does not.
    assert with_ws.peak_bytes == bare.peak_bytes
    extra = with_ws.predicted_allocated_bytes - bare.predicted_allocated_bytes
    workspaces = gpus.workspace_allocations(a10.compute_capability, versions.release())
    assert workspaces  # torch 2.13 keeps them
    assert extra == sum(-(-n // 512) * 512 for n in workspaces)


def test_simulated_throughput_is_estimated_for_the_target_gpu(tiny_bert):
    a10 = Session(tiny_bert).open_backend()
    h100 = Session(replace(tiny_bert, gpu="h100")).open_backend()
    slow, fast = a10.measure(8), h100.measure(8)
    assert slow.throughput_source == fast.throughput_source == "estimated"
    assert slow.step_flops == fast.step_flops > 0  # the same work...
    assert fast.samples_per_second > slow.samples_per_second  # ...on a faster GPU
    assert slow.step_seconds is None  # nothing was timed


def test_weights_that_alone_exceed_the_budget_fail_at_any_batch(tiny_bert):
    m = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=10_000)).measure(1)
    assert not m.fits
    assert "simulated out of memory" in m.error


def test_inference_style_peak_is_far_below_the_full_training_step():
    full = Settings(model="tiny-bert", seq_len=32)
    inference = full.with_protocol("inference-style")
    full_peak = (
        SimBackend(CatalogStep(full), policy=FitPolicy(capacity_bytes=BIG)).measure(4).peak_bytes
    )
    inf_peak = (
        SimBackend(CatalogStep(inference), policy=FitPolicy(capacity_bytes=BIG))
        .measure(4)
        .peak_bytes
    )
    assert inf_peak < 0.75 * full_peak


def test_a_bug_in_the_step_is_not_an_oom(tiny_bert, monkeypatch):
    backend = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=BIG))

    def broken(*args, **kwargs):
        raise RuntimeError("shape mismatch in layer 3")

    monkeypatch.setattr(CatalogStep, "run_step", broken)
    with pytest.raises(StepError, match="failed at batch 4: RuntimeError: shape mismatch"):
        backend.measure(4)


class FakeCuda(SimpleNamespace):
    """torch.cuda's memory API on CPU: the CUDA backend's logic runs without a GPU."""

    def __init__(self, oom_above: int | None = None, retries: int = 0):
        super().__init__(calls=[], oom_above=oom_above, retries=retries, stats_reads=0)

    def is_available(self):
        return True

    def get_device_properties(self, index):
        return SimpleNamespace(name="NVIDIA A10", total_memory=23609475072, major=8, minor=6)

    def reset_peak_memory_stats(self):
        self.calls.append("reset")

    def max_memory_allocated(self):
        return 1234

    def max_memory_reserved(self):
        return 4096

    def memory_stats(self):
        self.stats_reads += 1
        return {"num_alloc_retries": self.retries, "num_ooms": 0, "reserved_bytes.all.peak": 4096}

    def synchronize(self):
        self.calls.append("sync")

    def empty_cache(self):
        self.calls.append("empty_cache")


def test_cuda_backend_reads_the_device_peak_and_cleans_up_after_oom(tiny_bert):
    cuda = FakeCuda()
    backend = DeviceBackend(
        CatalogStep(tiny_bert),
        policy=FitPolicy(capacity_bytes=BIG),
        name="cpu",
        device_module=cuda,
        peak_stats=True,
    )
    m = backend.measure(2)
    assert (m.peak_bytes, m.reserved_bytes, m.measured) == (1234, 4096, True)
    assert m.step_seconds is not None and m.step_seconds > 0
    assert (m.samples_per_second, m.throughput_source) == (2 / m.step_seconds, "measured")
    # A sync after the tracked step, after the untimed warm-up, then after each timed step; a
    # step that fit needs no cache flush after it.
    assert cuda.calls == ["empty_cache", "reset"] + ["sync"] * (2 + backend.timed_steps)
    assert m.predicted_reserved_bytes is None  # the device reports its own
    assert m.breakdown.total > 0  # the tracker still splits the peak


def test_cuda_oom_is_caught_and_other_errors_are_not(tiny_bert, monkeypatch):
    cuda = FakeCuda()
    backend = DeviceBackend(
        CatalogStep(tiny_bert),
        policy=FitPolicy(capacity_bytes=BIG),
        name="cpu",
        device_module=cuda,
        peak_stats=True,
    )

    def oom(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(CatalogStep, "run_step", oom)
    m = backend.measure(512)
    assert not m.fits
    assert m.error.startswith("CUDA out of memory.")
    # Cached blocks go back before each probe (its reserved bytes are its own) and after an OOM.
    assert cuda.calls == ["empty_cache", "reset", "empty_cache"]

    def not_oom(*args, **kwargs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(CatalogStep, "run_step", not_oom)
    with pytest.raises(StepError, match="illegal memory access"):
        backend.measure(8)


def test_auto_picks_cuda_for_the_local_gpu_and_sim_for_another():
    cuda = FakeCuda()
    assert resolve_backend_name(Settings(), cuda) == "cuda"
    assert resolve_backend_name(Settings(gpu="a10"), cuda) == "cuda"
    assert resolve_backend_name(Settings(gpu="h100"), cuda) == "sim"
    assert resolve_backend_name(Settings(gpu_memory_gib=40), cuda) == "sim"


def test_a_session_judges_the_simulation_against_usable_memory():
    session = Session(Settings(model="tiny-bert", gpu="h100", backend="sim"))
    backend, gpu = session.open_backend(), session.gpu
    assert gpu.name == gpus.find_gpu("H100").name
    margin = int(gpu.usable_bytes * 0.02)  # the default margin, 2%
    assert backend.policy.capacity_bytes == gpu.usable_bytes
    assert backend.policy.limit_bytes == gpu.usable_bytes - margin
    assert backend.budget_bytes is None  # fake tensors trace to the end of any step
    session = Session(Settings(model="tiny-bert", gpu_memory_gib=12))
    custom_backend, custom = session.open_backend(), session.gpu
    assert custom.total_bytes == 12 * 2**30
    assert custom_backend.policy.limit_bytes < custom.usable_bytes < custom.total_bytes
    exact = Session(Settings(model="tiny-bert", gpu="t4", backend="sim", margin="1GiB"))
    exact = exact.open_backend()
    assert exact.policy.limit_bytes == gpus.find_gpu("t4").usable_bytes - 2**30


def test_compare_gives_each_gpu_the_answer_analyze_gives_it():

    settings = Settings(model="tiny-gpt2", seq_len=128, max_batch=4096)
    small, large = gpus.custom_gpu(1.0), gpus.custom_gpu(2.0)
    rows, probes = Session(settings).compare(catalog=(small, large))
    for row, gib in zip(rows, (1.0, 2.0), strict=True):
        expected = Session(settings.replace(gpu_memory_gib=gib)).analyze().optimal
        assert row.max_batch == expected.batch_size
    assert rows[0].max_batch < rows[1].max_batch
    # One pair of traces per compute capability: the second GPU reuses the first one's.
    assert [p.batch_size for p in probes].count(16) == 1


def test_compare_rates_speed_as_analyze_does_from_flops_and_bytes():
    # One speed model everywhere: samples/s at each GPU's max batch over samples/s at the
    # current batch on the chosen GPU, both estimated on the roofline.
    settings = Settings(model="tiny-gpt2", seq_len=64, max_batch=256, gpu="a10")
    a10, h100 = gpus.find_gpu("a10"), gpus.find_gpu("h100")
    rows, probes = Session(settings).compare(catalog=(a10, h100))
    analysis = Session(settings)
    report = analysis.analyze()
    by_gpu = {r.gpu.name: r for r in rows}
    expected = report.optimal.samples_per_second / report.current.samples_per_second
    assert by_gpu["A10"].relative_speed == pytest.approx(expected, rel=1e-3)
    assert by_gpu["H100 80GB"].relative_speed > by_gpu["A10"].relative_speed
