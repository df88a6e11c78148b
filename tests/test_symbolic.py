"""The symbolic sweep: every figure of a simulated step at any batch size read off two traced
steps, identical to tracing it, and a strategy that traces only the two and the answer, falling
back to traced probes (and saying why) wherever replays do not hold."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memorymark import Session, Settings, gpus
from memorymark.accounting.symbolic import StepRecord, SymbolicStep
from memorymark.backends import resolve
from memorymark.measurement import Measurement
from memorymark.search.strategies import FastStrategy, LinearStrategy
from memorymark.search.sweep import best_fit, sweep
from memorymark.search.symbolic import SymbolicStrategy

TRACED_AT = (2, 4)
CHECKED_AT = (3, 26)
"""Between the traces, past them, and far past them (an odd one: no grid to hide behind)."""

KINDS = {
    "bert": Settings(model="tiny-bert", seq_len=32),
    "gpt2": Settings(model="tiny-gpt2", seq_len=32),
    "t5": Settings(model="t5-small", seq_len=8),
    "vit": Settings(model="vit", image_size=32),
    "resnet": Settings(model="tiny-resnet", image_size=32),
    "llama-lora": Settings(model="tiny-llama", seq_len=16, lora_rank=4, precision="bf16-true"),
    "qlora": Settings(
        model="tiny-llama", seq_len=16, lora_rank=4, quantization="nf4", precision="bf16-mixed"
    ),
    "fsdp": Settings(model="tiny-gpt2", seq_len=32, dist="fsdp", gpus="2"),
}


def _backend(settings: Settings):
    return resolve.resolve(settings.replace(backend="sim"), gpu=gpus.find_gpu("a10")).open_backend()


@pytest.mark.parametrize("kind", KINDS)
def test_a_replayed_step_is_the_traced_step_entry_for_entry(kind):
    backend = _backend(KINDS[kind])
    replays = backend.keep_records()
    with backend.session():
        # FSDP's first step runs one-off operators: the strategy then fits through later ones.
        points = (*TRACED_AT, 6) if kind == "fsdp" else TRACED_AT
        for batch in points:
            backend.measure(batch)
            replays.keep(batch)
        if kind == "fsdp":
            assert "operators" in replays.fit(points[:2])
        assert replays.fit(points[-2:]) is None
        for batch in CHECKED_AT:
            traced = backend.measure(batch)
            replays.keep(batch)
            replayed = replays.replay(batch)
            assert replays.disagreement(batch) is None
            assert replayed is not None and replayed.replayed and not traced.replayed
            # Bytes, peaks, breakdown, the allocator's verdicts and retries, FLOPs, throughput.
            assert replace(replayed, replayed=False) == traced
            assert replayed.timeline == traced.timeline


def test_a_sequence_length_is_replayed_with_polynomials_of_degree_two():
    s = Settings(model="tiny-gpt2", attention="eager", backend="sim", gpu="a10", current_batch=2)
    from memorymark.search.seq_len import SeqLenMeasurer

    measurer = SeqLenMeasurer(_backend(s), s, 2)
    replays = measurer.keep_records()
    for length in (16, 32, 48, 80):
        measurer.measure(length)
        replays.keep(length)
    assert replays.fit((16, 32)) is None
    assert "allocation" in replays.disagreement(80)  # eager attention's scores: s squared
    assert replays.fit((16, 32, 48)) is None
    assert replays.disagreement(80) is None
    traced = measurer.probes[80]
    replayed = replays.replay(80)
    assert replayed.batch_size == 80 and measurer.probes[80].replayed  # what the answer reads
    assert replace(replayed, replayed=False) == replace(traced, batch_size=80)


def _record(sizes: list[int], ops: list[int]) -> StepRecord:
    events = [*sizes, *(~i for i in range(len(sizes)))]
    return StepRecord(
        events_first_seq=0,
        events=events,
        baseline_events=(0, []),
        timeline=ops,
        categories=[(0, 0, 0, n, 0, 0) for n in ops],
        start_categories=(0,) * 6,
        work=[(n, n, 1.0) for n in ops],
    )


def test_sizes_are_read_as_exact_polynomials_or_not_at_all():
    step = SymbolicStep.fit({2: _record([10, 7], [10, 17]), 4: _record([20, 7], [20, 27])})
    assert isinstance(step, SymbolicStep)
    assert step.at(9).events[:2] == [45, 7] and step.at(9).timeline == [45, 52]
    assert step.at(9).peak_bytes == 52 and step.at(9).peak_breakdown().activations == 52
    # 10 bytes a sample less 13: no non-negative size at batch 1; no whole one at 2.5.
    odd = SymbolicStep.fit({2: _record([7], [7]), 4: _record([27], [27])})
    assert odd.at(1) is None
    assert SymbolicStep.fit({2: _record([7], [7]), 6: _record([17], [17])}).at(3) is None
    assert "differs" in step.disagreement(9, _record([46, 7], [46, 53]))


def test_steps_that_allocate_differently_do_not_fit():
    why = SymbolicStep.fit({2: _record([10, 7], [10, 17]), 4: _record([20], [20])})
    assert isinstance(why, str) and "event logs differ" in why


def test_a_replayed_step_starts_its_loop_where_the_traced_ones_did():
    # Where priming began and where the optimizer step begins: the same in every trace, and
    # carried to the step read off them, so its loop makes the optimizer state where theirs did.
    def marked(sizes, ops, optimizer_at=2):
        return replace(_record(sizes, ops), state_from=0, optimizer_at=optimizer_at)

    step = SymbolicStep.fit({2: marked([10, 7], [10, 17]), 4: marked([20, 7], [20, 27])})
    assert (step.at(9).state_from, step.at(9).optimizer_at) == (0, 2)
    why = SymbolicStep.fit({2: marked([10, 7], [10, 17]), 4: marked([20, 7], [20, 27], 3)})
    assert why == "the optimizer steps begin at different events"


# -- the strategy, on a backend whose peak is a known function of the batch ---------------------
LIMIT = 300_000


def _timeline(batch: int) -> tuple[int, ...]:
    return (5_000 + 900 * batch, 10_000 + 1_000 * batch)


class FunctionReplayer:
    """Replays from the same function the backend measures: a replay that holds; or not."""

    def __init__(self, backend, *, fit_error=None, wrong=False, odd_first=False) -> None:
        self.shadow = type(backend)(backend.timeline, backend.limit_bytes, backend.capacity_bytes)
        self.fit_error, self.wrong, self.odd_first = fit_error, wrong, odd_first
        self.kept: list[int] = []
        self.fitted: list[tuple[int, ...]] = []

    def keep(self, value: int) -> None:
        self.kept.append(value)

    def fit(self, points: tuple[int, ...]) -> str | None:
        self.fitted.append(points)
        if self.odd_first and 8 in points:  # batch 8 is the first step traced
            return "the steps run 658 and 546 operators"
        return self.fit_error

    def size_disagreement(self, value: int) -> str | None:
        return self.disagreement(value)

    def replay(self, value: int) -> Measurement:
        return replace(self.shadow.measure(value), replayed=True)

    def disagreement(self, value: int) -> str | None:
        return "allocation 3 differs: 512 predicted, 1024 traced" if self.wrong else None


def _run(strategy, backend, also=(16,)) -> list[Measurement]:
    return list(sweep(backend, strategy, also=also))


def _answers(results: list[Measurement]) -> tuple[int | None, int | None]:
    best, largest = best_fit(results), best_fit(results, runs=True)
    return best and best.batch_size, largest and largest.batch_size


def test_symbolic_traces_two_batches_and_the_answer_and_replays_the_rest(function_backend):
    linear = _run(LinearStrategy(capacity_bytes=LIMIT), function_backend(_timeline, LIMIT))
    backend = function_backend(_timeline, LIMIT)
    replayer = FunctionReplayer(backend)
    strategy = SymbolicStrategy(replayer=replayer, capacity_bytes=LIMIT)
    results = _run(strategy, backend, also=(16, 40))
    assert _answers(results) == _answers(linear) == (288, 288)
    assert backend.tried == [8, 16, 288]
    assert replayer.kept == [8, 16, 288]
    assert {m.batch_size for m in results if m.replayed} == {40, 296}
    assert strategy.fallback is None


def test_an_answer_whose_trace_differs_falls_back_to_traced_probes(function_backend):
    backend = function_backend(_timeline, LIMIT)
    strategy = SymbolicStrategy(
        replayer=FunctionReplayer(backend, wrong=True), capacity_bytes=LIMIT
    )
    results = _run(strategy, backend)
    assert not any(m.replayed for m in results)
    assert _answers(results) == (288, 288)
    assert backend.tried[:3] == [8, 16, 288] and len(backend.tried) > 3
    assert strategy.fallback.startswith("the step traced at 288 differs from its replay")


def test_traces_that_do_not_align_search_as_the_fast_strategy(function_backend):
    fast_backend = function_backend(_timeline, LIMIT)
    _run(FastStrategy(capacity_bytes=LIMIT), fast_backend)
    backend = function_backend(_timeline, LIMIT)
    replayer = FunctionReplayer(backend, fit_error="the steps run 658 and 546 operators")
    strategy = SymbolicStrategy(replayer=replayer, capacity_bytes=LIMIT)
    results = _run(strategy, backend)
    # The third trace is the fast strategy's own next probe: nothing traced is wasted.
    assert backend.tried == fast_backend.tried
    assert replayer.fitted == [(8, 16), (16, backend.tried[2])]
    assert strategy.fallback == "the steps run 658 and 546 operators"
    assert _answers(results) == (288, 288)


def test_an_odd_first_step_fits_through_the_next_two_and_checks_its_sizes(function_backend):
    backend = function_backend(_timeline, LIMIT)
    replayer = FunctionReplayer(backend, odd_first=True)
    strategy = SymbolicStrategy(replayer=replayer, capacity_bytes=LIMIT)
    results = _run(strategy, backend)
    assert _answers(results) == (288, 288)
    # The fast strategy's guess was the answer: three traces, the rest replayed.
    assert backend.tried == [8, 16, 288] and replayer.fitted == [(8, 16), (16, 288)]
    assert strategy.fallback is None and any(m.replayed for m in results)


def test_without_a_replayer_it_is_the_fast_strategy_and_says_why(function_backend):
    fast_backend, backend = function_backend(_timeline, LIMIT), function_backend(_timeline, LIMIT)
    _run(FastStrategy(capacity_bytes=LIMIT), fast_backend)
    strategy = SymbolicStrategy(replayer=None, why_not="a GPU traces", capacity_bytes=LIMIT)
    _run(strategy, backend)
    assert backend.tried == fast_backend.tried
    assert strategy.fallback == "a GPU traces"


# A step that fits to batch 5 and runs to 7: the first grid point, 8, does neither.
BELOW = dict(limit_bytes=15_000, capacity_bytes=17_000)


def _below(function_backend, replayer=None, **limits):
    """(strategy, results, batch sizes traced) of a search below the first grid point: the
    fast strategy's, or with `replayer` options the symbolic one's."""
    limits = limits or BELOW
    backend = function_backend(_timeline, limits["limit_bytes"], limits["capacity_bytes"])
    if replayer is None:
        strategy = FastStrategy(**limits)
    else:
        strategy = SymbolicStrategy(replayer=FunctionReplayer(backend, **replayer), **limits)
    return strategy, _run(strategy, backend, also=()), backend.tried


def test_a_first_grid_point_that_does_not_fit_is_replayed_from_below_it(function_backend):
    _, fast, fast_tried = _below(function_backend)
    strategy, results, tried = _below(function_backend, replayer={})
    assert _answers(results) == _answers(fast) == (5, 7)
    # The fast strategy's descent to 4, a fit through 4 and 8 (a whole trace that the
    # allocator said does not fit), the answer traced: 3 traces where tracing took 5.
    assert fast_tried == [8, 4, 5, 6, 7]
    assert tried == [8, 4, 5] and strategy.replayer.fitted == [(4, 8)]
    assert {m.batch_size for m in results if m.replayed} == {6, 7}
    assert strategy.fallback is None


def test_an_odd_first_step_that_does_not_fit_checks_the_fit_below_it(function_backend):
    strategy, results, tried = _below(function_backend, replayer={"odd_first": True})
    assert _answers(results) == (5, 7)
    # 8, the first step, does not align: the fit goes through 4 and the fast strategy's next
    # probe (5, the answer), and 8's sizes check it.
    assert tried == [8, 4, 5] and strategy.replayer.fitted == [(4, 8), (4, 5)]
    assert strategy.fallback is None
    assert {m.batch_size for m in results if m.replayed} == {6, 7}


def test_a_first_fit_far_below_the_grid_traces_no_more_than_the_fast_strategy(function_backend):
    tight = dict(limit_bytes=12_000, capacity_bytes=12_000)
    _, fast, fast_tried = _below(function_backend, **tight)
    strategy, results, tried = _below(function_backend, replayer={}, **tight)
    assert _answers(results) == _answers(fast) == (2, 2)
    # 2 fits, 4 does not: fitted through them, 3 replayed, then traced to check the replay.
    assert tried == fast_tried == [8, 4, 2, 3]
    assert strategy.replayer.fitted == [(2, 4)] and strategy.fallback is None


def test_nothing_fits_below_the_first_grid_point_says_why(function_backend):
    tiny = dict(limit_bytes=5_000, capacity_bytes=5_000)
    _, fast, fast_tried = _below(function_backend, **tiny)
    strategy, results, tried = _below(function_backend, replayer={}, **tiny)
    assert _answers(results) == _answers(fast) == (None, None)
    assert tried == fast_tried == [8, 4, 2, 1]
    assert strategy.fallback == "batch 8 does not fit, nor any smaller size: nothing to replay"


def test_states_past_the_capacity_leave_batch_1_the_one_probe(function_backend):
    tiny = dict(limit_bytes=5_000, capacity_bytes=5_000, floor_bytes=5_001)
    _, fast, fast_tried = _below(function_backend, **tiny)
    strategy, results, tried = _below(function_backend, replayer={}, **tiny)
    assert _answers(results) == _answers(fast) == (None, None)
    assert tried == fast_tried == [1]
    assert strategy.fallback.endswith("a step may use, so batch 1 was the one probe")
    # A floor within the capacity changes nothing: the search is the one without it.
    _, _, searched = _below(function_backend, replayer={}, **{**tiny, "floor_bytes": 4_999})
    assert searched == [8, 4, 2, 1]


def test_small_sizes_that_do_not_align_search_as_the_fast_strategy(function_backend):
    _, fast, fast_tried = _below(function_backend)
    strategy, results, tried = _below(
        function_backend, replayer={"fit_error": "the steps run 658 and 546 operators"}
    )
    assert _answers(results) == _answers(fast) == (5, 7)
    # Nothing traced is wasted: the third trace is the fast strategy's own next probe.
    assert tried == fast_tried and strategy.replayer.fitted == [(4, 8), (4, 5)]
    assert strategy.fallback == "the steps run 658 and 546 operators"


# -- end to end: a session's sweep ---------------------------------------------------------------
SMALL = dict(model="tiny-gpt2", seq_len=128, backend="sim", gpu_memory_gib=1, step=32)


def test_a_symbolic_sweep_answers_as_the_linear_walk_tracing_three_steps():
    linear = Session(Settings(**SMALL, strategy="linear")).analyze(fixes=False)
    session = Session(Settings(**SMALL))
    report = session.analyze(fixes=False)
    assert report.settings.search.strategy == "symbolic"
    assert report.optimal.batch_size == linear.optimal.batch_size
    assert report.max_fit.batch_size == linear.max_fit.batch_size
    by_batch = {m.batch_size: m for m in linear.measurements}
    for m in report.measurements:
        if m.batch_size in by_batch:
            assert replace(m, replayed=False) == by_batch[m.batch_size]
    traced = [m.batch_size for m in report.measurements if not m.replayed]
    assert traced == [32, 64, report.optimal.batch_size]
    assert report.search_fallback is None
    assert report.search_note.startswith("3 steps traced, ")


def test_a_first_grid_point_that_does_not_fit_traces_three_steps_below_it():
    # Batch 256 does not fit: the fast strategy traces 13 probes here (256, 128, then 11
    # converging to 192 and 196), the symbolic one 3, on a real step's allocator replay.
    session = Session(Settings(**{**SMALL, "step": 256}))
    report = session.analyze(fixes=False, plan=False)
    optimal, largest = report.optimal.batch_size, report.max_fit.batch_size
    assert [m.batch_size for m in report.measurements if not m.replayed] == [256, 128, optimal]
    assert report.search_fallback is None and largest > optimal
    # The fast strategy's answers, since verdicts are monotone: traced, each boundary holds.
    verdicts = {b: session.measure(b) for b in (optimal + 1, largest, largest + 1)}
    assert not verdicts[optimal + 1].fits
    assert verdicts[largest].runs and not verdicts[largest + 1].runs


def test_a_model_whose_states_pass_the_gpu_traces_batch_1_and_the_current_batch():
    # GPT-2's fp32 AdamW states (about 2 GiB) on a 1 GiB GPU: no batch can run.
    settings = Settings(**{**SMALL, "model": "gpt2", "seq_len": 32, "current_batch": 16})
    report = Session(settings).analyze(fixes=False, plan=False)
    assert [m.batch_size for m in report.measurements] == [1, 16]
    assert report.optimal is None and not report.measurements[0].runs
    assert "states alone" in report.search_note


def test_a_sweep_with_an_evaluation_pass_traces_every_probe_and_says_why():
    report = Session(Settings(**SMALL, eval_batch=4)).analyze(fixes=False, plan=False)
    assert not any(m.replayed for m in report.measurements)
    assert "left no record" in report.search_fallback
    assert report.search_note.startswith("The symbolic search traced every probe")


def test_the_json_says_which_probes_were_replayed(capsys):
    from memorymark.cli.parser import main

    assert main(["analyze", "tiny-gpt2", "--seq-len", "128", "--gpu-memory", "1",
                 "--step", "32", "--backend", "sim", "--json"]) == 0  # fmt: skip
    d = json.loads(capsys.readouterr().out)
    assert d["strategy"] == "symbolic" and d["search_fallback"] is None
    assert d["replayed"] == sum(row["replayed"] for row in d["results"]) > 0


def test_a_symbolic_sequence_length_search_answers_as_the_linear_walk():
    s = Settings(model="tiny-gpt2", attention="eager", backend="sim", gpu_memory_gib=1,
                 current_batch=512, seq_step=8, find="seq-len")  # fmt: skip
    linear = Session(s.replace(strategy="linear")).find_seq_len()
    session = Session(s)
    answer = session.find_seq_len()
    assert (answer.optimal_seq_len, answer.max_seq_len) == (
        linear.optimal_seq_len,
        linear.max_seq_len,
    )
    assert answer.optimal_seq_len < answer.search_cap  # memory ends it, not the positions
    traced = [n for n, m in answer.probes if not m.replayed]
    assert traced == [8, 16, 24, answer.optimal_seq_len]
    assert any(m.replayed for _, m in answer.probes)
    assert answer.search_fallback is None


def test_a_forced_disagreement_falls_back_and_answers_as_the_linear_walk(monkeypatch):
    linear = Session(Settings(**SMALL, strategy="linear")).analyze(fixes=False, plan=False)
    monkeypatch.setattr(SymbolicStep, "disagreement", lambda self, x, traced: "forced")
    report = Session(Settings(**SMALL)).analyze(fixes=False, plan=False)
    assert (
        report.search_fallback
        == f"the step traced at {report.optimal.batch_size} differs from its replay: forced"
    )
    assert not any(m.replayed for m in report.measurements)
    assert report.optimal.batch_size == linear.optimal.batch_size
    assert report.max_fit.batch_size == linear.max_fit.batch_size


def test_compare_gpus_traces_one_gpu_per_capability_and_replays_the_others():
    catalog = tuple(gpus.find_gpu(name) for name in ("a10", "a10g", "t4"))
    settings = Settings(model="tiny-gpt2", seq_len=128, gpu="a10", backend="sim", step=64)
    fast_rows, _ = Session(settings.replace(strategy="fast")).compare(catalog=catalog)
    rows, measurements = Session(settings).compare(catalog=catalog)
    assert [(r.gpu.name, r.max_batch, r.peak_bytes, r.relative_speed) for r in rows] == [
        (r.gpu.name, r.max_batch, r.peak_bytes, r.relative_speed) for r in fast_rows
    ]
    # The A10 (24 GB) and the A10G (23 GB) share compute capability 8.6: one is traced.
    traced = [m for m in measurements if not m.replayed]
    assert len(traced) == 6 and len(measurements) > len(traced)


def test_one_place_picks_a_strategy_from_its_name_and_what_the_measurer_keeps():
    from memorymark.search.pick import pick_strategy

    grid = {"step": 8, "max_batch": 64, "capacity_bytes": 100, "limit_bytes": 90}
    assert type(pick_strategy("linear", object(), **grid)) is LinearStrategy
    fast = pick_strategy("fast", object(), find_max=False, **grid)
    assert type(fast) is FastStrategy and not fast.find_max and fast.limit_bytes == 90

    class Keeps:
        def keep_records(self) -> str:
            return "replayer"

    kept = pick_strategy("symbolic", Keeps(), degree=2, **grid)
    assert isinstance(kept, SymbolicStrategy)
    assert (kept.replayer, kept.degree, kept.fallback, kept.confirmed) == (
        "replayer",
        2,
        None,
        False,
    )
    traced = pick_strategy("symbolic", object(), why_not="the cuda backend traces", **grid)
    assert isinstance(traced, SymbolicStrategy)
    assert (traced.replayer, traced.fallback) == (None, "the cuda backend traces")
    confirmed = pick_strategy("symbolic", Keeps(), confirmed="elsewhere", **grid)  # type: ignore[arg-type]
    assert isinstance(confirmed, SymbolicStrategy)
    assert (confirmed.replayer, confirmed.confirmed) == ("elsewhere", True)
