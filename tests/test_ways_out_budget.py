"""The search for ways out under its own time budget: each way out as it is found, a search
that stops between two pieces of work and names what it did not finish, and the stop worded as
what happened (the sweep finished; the ways out ran out of time), never as a sweep cut short.

Each step and state count here is a fake that moves a fake clock, so budgets are exact."""

from __future__ import annotations

import pytest

from memorymark import Session, gpus
from memorymark.analyses import fixes, hardware
from memorymark.analyses.budget import OutOfTime, TimeBudget
from memorymark.analyses.fixes import WaysOutSearch
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.markdown import report_markdown
from memorymark.reporting.record import record_to_report, report_to_record
from memorymark.settings import Costs, Settings
from memorymark.units import GIB

TINY = Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1, margin="49%")


class Clock:
    """A clock that moves only when a fake piece of work says so."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_budget_runs_work_until_the_next_piece_would_pass_it() -> None:
    clock = Clock()
    budget = TimeBudget(time_limit_seconds=25, clock=clock)

    def work(seconds: float) -> float:
        clock.now += seconds
        return seconds

    assert budget.spend("step", work, 10) == 10  # 0 s spent, none timed yet
    assert budget.spend("step", work, 10) == 10  # 10 s spent + the last 10 s: 20 <= 25
    with pytest.raises(OutOfTime, match=r"the time limit \(25 s\)"):
        budget.spend("step", work, 1)  # 20 s spent + the last 10 s would pass 25
    assert budget.stopped_by == "the time limit (25 s)" and clock.now == 20
    with pytest.raises(OutOfTime):
        budget.check()  # once stopped, stays stopped
    unlimited = TimeBudget(clock=clock)
    assert unlimited.spend("step", work, 1000) == 1000 and unlimited.stopped_by is None


class FakeBench:
    """The door a Session hands the search, with every step and state count a fake that takes
    `seconds` on `clock`: batch 1 as configured (`base`) needs 100 GiB, every other step 50 (a
    way out, too big for the 1 GiB GPU) and the states 0.1 GiB, so every change of settings is
    stepped. `done` is the order of the work, for the test to read."""

    def __init__(self, clock: Clock, seconds: float, base: Settings) -> None:
        self.clock, self.seconds = clock, seconds
        self.base = base.replace(backend="sim")  # the ways out are simulated
        self.done: list[str] = []
        self.real = Session(base).bench

    def simulated_gpu(self, settings: Settings) -> gpus.GPU:
        return self.real.simulated_gpu(settings)

    def measure(self, settings: Settings, gpu: gpus.GPU, batch_size: int = 1) -> Measurement:
        self.clock.now += self.seconds
        self.done.append(f"step {gpu.name} x{settings.hardware.gpu_count}")
        need = 100 * GIB if settings == self.base else 50 * GIB  # a change needs half of batch 1
        return Measurement(batch_size=1, fits=False, runs=False, peak_bytes=need,
                           required_bytes=need - 1, backend="sim", measured=False)  # fmt: skip

    def counted_states(self, settings: Settings) -> tuple[int, int]:
        self.clock.now += self.seconds
        self.done.append("count")
        return GIB // 10, 10**6


def _fake_work(
    monkeypatch: pytest.MonkeyPatch, clock: Clock, seconds: float, base: Settings = TINY
) -> FakeBench:
    """A `FakeBench`, with the many-GPU stages found empty without a step."""
    monkeypatch.setattr(hardware, "fewest_gpus", lambda *a, **k: None)  # one stage, no step
    return FakeBench(clock, seconds, base)


def test_each_way_out_comes_the_moment_its_stage_ends_in_the_planned_order(monkeypatch) -> None:
    clock = Clock()
    bench = _fake_work(monkeypatch, clock, seconds=1.0)
    search = WaysOutSearch(TINY, bench=bench, clock=clock)
    assert search.planned[:3] == (
        "gradient checkpointing",
        "bf16-true weights and optimizer",
        "LoRA rank 16",
    )
    # Other hardware: one bigger GPU first, then the many-GPU stages (the longest) last.
    bigger = search.planned.index(hardware.BIGGER_GPU)
    assert search.planned[bigger : bigger + 3] == (
        hardware.BIGGER_GPU,
        fixes.CLOSEST_ELSEWHERE,
        hardware.SEVERAL_GPUS,
    )
    assert search.planned[-1] == fixes.QLORA_SEVERAL
    seen = []
    for label, fix in search.stages():
        # What is left is known at every stage: the page names it if the worker dies now.
        seen.append((label, fix is not None, search.not_finished[:1]))
    labels = [label for label, _, _ in seen]
    assert tuple(labels) == search.planned  # every stage, in the planned order, once
    assert seen[0] == ("gradient checkpointing", True, ("bf16-true weights and optimizer",))
    answer = search.answer()  # the search ran: answering steps nothing again
    assert [f.label for f in answer.fixes] == [f.label for f in search.found]
    assert answer.stopped_by is None and answer.not_finished == ()


def test_a_search_past_its_budget_keeps_what_it_found_and_names_the_rest(monkeypatch) -> None:
    clock = Clock()
    bench = _fake_work(monkeypatch, clock, seconds=10.0)
    done = bench.done
    # batch 1 as configured (10 s), then checkpointing: its count (20 s) and step (30 s);
    # LoRA's count would start at 30 s and, at 10 s a count, pass 35 s: the search stops there.
    search = WaysOutSearch(TINY, bench=bench, time_limit_seconds=35, clock=clock)
    answer = search.answer()
    gpu = search.gpu.name
    assert done == [f"step {gpu} x1", "count", f"step {gpu} x1"]
    assert [f.label for f in answer.fixes] == ["gradient checkpointing"]
    assert answer.fixes[0].required_bytes == 50 * GIB - 1 and not answer.fixes[0].fits
    assert answer.stopped_by == "the time limit (35 s)"
    assert answer.not_finished == search.planned[1:]  # LoRA rank 16 ... the closest change
    assert hardware.BIGGER_GPU in answer.not_finished
    assert answer.required_bytes == 100 * GIB - 1  # batch 1 as configured was known


def test_a_budget_spent_before_batch_1_is_known_finds_nothing_and_says_so(monkeypatch) -> None:
    clock = Clock()
    bench = _fake_work(monkeypatch, clock, seconds=10.0)
    search = WaysOutSearch(TINY, bench=bench, time_limit_seconds=5, clock=clock)
    search.budget.check()  # the clock starts
    clock.now = 6.0  # the search's own set-up took the budget
    answer = search.answer()
    assert answer.fixes == () and answer.required_bytes is None
    assert answer.not_finished == search.planned


def _nothing_fits_report(**fields: object) -> Report:
    a10 = gpus.find_gpu("a10")
    probes = tuple(
        Measurement(
            batch_size=b,
            fits=False,
            runs=False,
            peak_bytes=500 * GIB,
            required_bytes=500 * GIB,
            backend="sim",
            measured=False,
        )  # fmt: skip
        for b in (8, 4, 2, 1)
    )
    lora = Settings(model="llama-3.1-70b", gpu="a10", lora_rank=16)
    bound = fixes._bound("LoRA rank 16", lora, a10, 140 * GIB, 21 * GIB)
    return Report(
        settings=Settings(model="llama-3.1-70b", gpu="a10"),
        costs=Costs(),
        gpu=a10,
        backend="sim",
        measurements=probes,
        elapsed_seconds=72.0,
        fixes=(bound,),
        batch_1_required_bytes=500 * GIB,
        **fields,
    )


def test_the_stop_says_the_sweep_finished_and_the_ways_out_ran_out_of_time() -> None:
    report = _nothing_fits_report(
        fixes_stopped_by="the time limit (120 s)",
        fixes_not_finished=("a bigger GPU", "several GPUs (FSDP)"),
    )
    assert report.stopped_by is None and report.partial_note is None  # the sweep finished
    assert report.ways_out_note == (
        "The sweep finished (no batch fits); the search for ways out then stopped at the time "
        "limit (120 s), after finding 1 way out (listed). Not finished: a bigger GPU, several "
        "GPUs (FSDP)."
    )
    d = report_to_dict(report)
    assert d["ways_out_stopped_by"] == "the time limit (120 s)"
    assert d["ways_out_not_finished"] == ["a bigger GPU", "several GPUs (FSDP)"]
    assert "middle of a probe" not in d["ways_out_note"]
    assert "Not finished: a bigger GPU" in report_markdown(report)
    again = record_to_report(report_to_record(report))  # the history keeps it
    assert again.ways_out_note == report.ways_out_note
    finished = _nothing_fits_report()
    assert finished.ways_out_note is None and report_to_dict(finished)["ways_out_note"] is None


def test_the_cli_prints_each_way_out_as_found_and_the_stop(monkeypatch, capsys) -> None:
    from memorymark.cli.parser import main

    clock = Clock()
    # Nothing fits: 615 of the 624 MiB a 1 GiB GPU leaves usable are kept free.
    argv = ["analyze", "tiny-bert", "--seq-len", "32", "--gpu-memory", "1", "--margin", "615MiB",
            "--max-batch", "8", "--no-save", "--ways-out-time-limit", "35"]  # fmt: skip
    asked = Settings(model="tiny-bert", seq_len=32, gpu_memory_gib=1, margin="615MiB", max_batch=8,
                     ways_out_time_limit_seconds=35)  # fmt: skip
    fake = _fake_work(monkeypatch, clock, seconds=10.0, base=asked)
    real = fixes.WaysOutSearch

    def on_fake_clock(settings, batch_1, *, bench, time_limit_seconds):
        assert settings == asked
        # Batch 1 as configured from the fake step too (not the sweep's real one), so the fake
        # changes need less than it.
        return real(settings, None, bench=fake, time_limit_seconds=time_limit_seconds, clock=clock)

    monkeypatch.setattr("memorymark.engine.WaysOutSearch", on_fake_clock)
    code = main(argv)
    out = capsys.readouterr().out
    assert code == 0
    # 615 MiB kept free leaves 0.01 GiB: the states (0.1 GiB) decide every change unstepped.
    found = out.index(
        "... way out found: gradient checkpointing: batch 1 needs >= 0.10 GiB of 0.01 "
        "(counted states, a lower bound), still too big"
    )
    assert out.index("... within 35 s (--ways-out-time-limit)") < found
    assert found < out.index("ways out (simulated at batch 1")  # the priced list comes last
    # Batch 1 (10 s), then two counts (20 s, 30 s); a third would pass 35 s.
    assert "Batch 1 needs 100.00 GiB on this Custom 1 GiB" in out
    assert "the search for ways out then stopped at the time limit (35 s), after finding 2" in out
    assert "Not finished: LoRA rank 16, 8-bit AdamW" in out
    assert "middle of a probe" not in out
