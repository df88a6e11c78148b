"""Search strategies: the exact batch sizes each tries, and that fast and linear agree."""

import contextlib

import pytest

from memorymark.fit import FitPolicy
from memorymark.measurement import Measurement
from memorymark.search.strategies import FastStrategy, LinearStrategy, predict_max_batch
from memorymark.search.sweep import best_fit, sweep
from memorymark.settings import Settings


def affine_two_phases(batch):
    # Small batches peak in the "optimizer" (flat 600), large ones in "backward" (7 per sample):
    # the total peak is not affine, the timeline is.
    return (100 + 5 * batch, 600 + batch, 50 + 7 * batch)


def run(function_backend, strategy_cls, timeline, capacity, step=8, max_batch=4096, also=()):
    backend = function_backend(timeline, capacity)
    strategy = strategy_cls(step=step, max_batch=max_batch, capacity_bytes=capacity)
    measurements = list(sweep(backend, strategy, also=also))
    best = best_fit(measurements)
    return (best.batch_size if best else None), backend.tried, backend


def test_fast_traces_two_batches_predicts_verifies_and_shows_the_next_fails(function_backend):
    # 50 + 7b <= 1000  ->  b <= 135.7, so 128 fits and 136 does not.
    best, tried, _ = run(function_backend, FastStrategy, affine_two_phases, 1000)
    assert best == 128
    assert tried == [8, 16, 128, 136]


def test_linear_walks_the_grid_until_the_first_oom(function_backend):
    best, tried, _ = run(function_backend, LinearStrategy, affine_two_phases, 1000)
    assert best == 128
    assert tried == list(range(8, 137, 8))


def test_a_line_through_two_total_peaks_would_overshoot():
    # Peaks at 8 and 16 are both the flat "optimizer" phase (608, 616): a line through them
    # predicts 392 samples fit, nearly 3x the truth. The per-op timeline gives 950/7 = 135.7.

    def m(b):
        t = affine_two_phases(b)
        return Measurement(
            batch_size=b, fits=True, peak_bytes=max(t), backend="f", measured=False, timeline=t
        )

    assert predict_max_batch(m(8), m(16), 1000) == pytest.approx(950 / 7)


def test_fast_bisects_when_the_prediction_is_too_high(function_backend):
    def quadratic(batch):
        return (100 + batch * batch // 10,)

    best, tried, _ = run(function_backend, FastStrategy, quadratic, 1000)
    assert best == 88  # 100 + 88*88/10 = 874; 96 -> 1021
    assert tried[:2] == [8, 16]
    assert tried[-1] in (88, 96)
    # Interpolating on required bytes lands low on a convex curve; a halving follows.
    assert len(tried) <= 11


def test_a_missed_prediction_interpolates_on_required_bytes(function_backend):
    # Reserved bytes 5% above the live bytes the traces extrapolate: the guess overshoots, and
    # the line through the traces and the failed guess lands on the answer at once.
    def live(batch):
        return (int((100 + 7 * batch) / 1.05),)

    backend = function_backend(live, 1000, required=lambda b: 100 + 7 * b)
    strategy = FastStrategy(step=8, capacity_bytes=1000)
    measurements = []
    for m in sweep(backend, strategy):
        measurements.append(m)
    assert best_fit(measurements).batch_size == 128  # 100 + 7 * 128 = 996
    assert len(backend.tried) <= 6


def test_fast_gallops_when_the_prediction_is_too_low(function_backend):
    def sublinear(batch):
        return (100 + int(60 * batch**0.5),)

    best_fast, tried, _ = run(function_backend, FastStrategy, sublinear, 1000)
    best_linear, linear_tried, _ = run(function_backend, LinearStrategy, sublinear, 1000)
    assert best_fast == best_linear == 224
    assert tried[:4] == [8, 16, 88, 96]  # the prediction (88) fits, and so does 96: gallop
    assert len(tried) == 11 < len(linear_tried) == 29


@pytest.mark.parametrize("step", [1, 4, 8, 32])
@pytest.mark.parametrize("capacity", [700, 1000, 5000, 123_456])
def test_fast_and_linear_agree(function_backend, step, capacity):
    fast, _, _ = run(function_backend, FastStrategy, affine_two_phases, capacity, step=step)
    linear, _, _ = run(function_backend, LinearStrategy, affine_two_phases, capacity, step=step)
    assert fast == linear


def test_below_the_first_grid_point_both_bisect_down_to_batch_one(function_backend):
    def heavy(batch):
        return (900 + 30 * batch,)  # batch 3 fits (990), 4 does not

    fast, fast_tried, _ = run(function_backend, FastStrategy, heavy, 1000)
    linear, linear_tried, _ = run(function_backend, LinearStrategy, heavy, 1000)
    assert fast == linear == 3
    assert fast_tried == linear_tried == [8, 4, 2, 3]


def test_nothing_fits_gives_no_answer(function_backend):
    best, tried, _ = run(function_backend, FastStrategy, lambda b: (2000 + b,), 1000)
    assert best is None
    assert tried == [8, 4, 2, 1]


def test_nothing_fits_from_a_large_first_probe_halves_down_to_one(function_backend):
    # As `--find seq-len` starts at 1024 tokens: with nothing measured that fits there is no
    # estimate, so each failure halves the range (log2 probes) rather than galloping down
    # from the last failure (1024, 512, 256, 255, 253, 249, ... took 15).
    best, tried, _ = run(function_backend, FastStrategy, lambda b: (2000 + b,), 1000, step=1024)
    assert best is None
    assert tried == [1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1]


def test_the_cap_stops_the_search(function_backend):
    best, tried, _ = run(function_backend, FastStrategy, affine_two_phases, 10**9, max_batch=64)
    assert best == 64
    assert max(tried) == 64


def test_the_current_batch_is_measured_unless_already_known(function_backend):
    _, tried, _ = run(function_backend, FastStrategy, affine_two_phases, 1000, also=(16, 20))
    assert tried == [8, 16, 128, 136, 20]
    _, tried, backend = run(function_backend, FastStrategy, affine_two_phases, 1000, also=(500,))
    # Past a failure too: a current batch that does not fit says what it would need.
    assert tried[-1] == 500


def run_margin(function_backend, strategy_cls, limit, capacity, step=8, timeline=affine_two_phases):
    backend = function_backend(timeline, limit, capacity)
    strategy = strategy_cls(step=step, max_batch=4096, capacity_bytes=capacity, limit_bytes=limit)
    measurements = list(sweep(backend, strategy))
    recommended, maximum = best_fit(measurements), best_fit(measurements, runs=True)
    return recommended.batch_size, maximum.batch_size, backend.tried


@pytest.mark.parametrize("strategy_cls", [FastStrategy, LinearStrategy])
def test_both_boundaries_are_found_the_margin_s_and_the_capacity_s(function_backend, strategy_cls):
    # 50 + 7b <= 1000 -> 128 fits the margin's limit; 50 + 7b <= 1200 -> 164 runs at capacity.
    recommended, maximum, tried = run_margin(function_backend, strategy_cls, 1000, 1200)
    assert (recommended, maximum) == (128, 160)
    assert {128, 136, 160, 168} <= set(tried)


def test_fast_finds_the_maximum_in_a_few_probes_past_the_recommended(function_backend):
    _, _, tried = run_margin(function_backend, FastStrategy, 1000, 1200)
    assert tried[:4] == [8, 16, 128, 136]
    assert len(tried) <= 8


def test_no_margin_takes_no_extra_probe(function_backend):
    assert run_margin(function_backend, FastStrategy, 1000, 1000)[2] == [8, 16, 128, 136]


def test_below_the_grid_both_boundaries_count_every_batch(function_backend):
    # 50 + 7b: the limit 90 holds b <= 5, the capacity 110 holds b <= 8.
    recommended, maximum, _ = run_margin(
        function_backend, FastStrategy, 90, 110, step=16, timeline=lambda b: (50 + 7 * b,)
    )
    assert (recommended, maximum) == (5, 8)


def test_stopping_early_still_releases_the_backend(function_backend):
    backend = function_backend(affine_two_phases, 1000)
    strategy = FastStrategy(step=8, capacity_bytes=1000)
    with contextlib.closing(sweep(backend, strategy)) as probes:
        next(probes)
    assert backend.released
    assert backend.tried == [8]


def test_max_batch_below_step_is_rejected():
    with pytest.raises(ValueError, match="max_batch at least step"):
        FastStrategy(step=8, max_batch=4)


def test_fast_and_linear_agree_on_the_simulation_where_reserved_bytes_decide(tiny_bert):
    # The simulated verdict is the allocator model's reserved bytes, not the live-bytes timeline
    # the fast strategy extrapolates; verification still lands both on the same answer.
    from memorymark.backends.sim import SimBackend
    from memorymark.step.catalog import CatalogStep

    unbounded = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=2**40))
    capacity = unbounded.measure(60).required_bytes
    answers = []
    for strategy_cls in (FastStrategy, LinearStrategy):
        backend = SimBackend(CatalogStep(tiny_bert), policy=FitPolicy(capacity_bytes=capacity))
        strategy = strategy_cls(step=8, max_batch=512, capacity_bytes=capacity)
        answers.append(best_fit(list(sweep(backend, strategy))).batch_size)
    assert answers[0] == answers[1]
    best = answers[0]
    assert unbounded.measure(best).required_bytes <= capacity
    assert unbounded.measure(best + 8).required_bytes > capacity


def test_borrowed_traces_start_at_the_prediction_and_take_two_probes(function_backend):
    # Compare GPUs hands each GPU the traces of another with the same kernels.
    first = run(function_backend, FastStrategy, affine_two_phases, 1000)[2]
    traces = (first.measure(8), first.measure(16))
    backend = function_backend(affine_two_phases, 1400)
    strategy = FastStrategy(step=8, capacity_bytes=1400, traces=traces, find_max=False)
    best = best_fit(list(sweep(backend, strategy)))
    # 50 + 7b <= 1400 -> b <= 192.9: the prediction 192 fits, 200 does not.
    assert (best.batch_size, backend.tried) == (192, [192, 200])


def test_borrowed_traces_that_overshoot_walk_down(function_backend):
    # Live bytes 10% under what the GPU holds: the prediction (136) overshoots, 128 settles it.
    def live(batch):
        return (int((100 + 7 * batch) / 1.10),)

    def required(batch):
        return 100 + 7 * batch

    def make(capacity):
        return function_backend(live, capacity, required=required)

    traces = (make(10**9).measure(8), make(10**9).measure(16))
    backend = make(1000)
    strategy = FastStrategy(step=8, capacity_bytes=1000, traces=traces, find_max=False)
    assert best_fit(list(sweep(backend, strategy))).batch_size == 128
    assert backend.tried == [136, 128]


def test_a_bisection_from_nothing_stays_on_the_grid_and_ends(function_backend):
    # Borrowed traces that under-count (30% of the slope) overshoot twice; the search from 0
    # then used to land between grid points and propose the same batch forever.
    def live(batch):
        return (3_890_084, 3_890_084 + int(0.3 * 179_506 * batch))

    def required(batch):
        return 4_322_316 + 179_506 * batch

    def make(capacity):
        return function_backend(live, capacity, required=required)

    traces = (make(10**12).measure(8), make(10**12).measure(16))
    backend = make(10**7)
    strategy = FastStrategy(step=8, max_batch=100, capacity_bytes=10**7, traces=traces,
                            find_max=False)  # fmt: skip
    best = best_fit(list(sweep(backend, strategy)))
    assert best.batch_size == 24  # 4.32 MB + 0.18 MB x 24 <= 10 MB; 32 does not fit
    assert all(b % 8 == 0 for b in backend.tried)
    assert len(backend.tried) == len(set(backend.tried)) < 10


def test_max_batch_one_tries_nothing_larger(function_backend):
    _, tried, _ = run(function_backend, FastStrategy, affine_two_phases, 10**6, step=1, max_batch=1)
    assert tried == [1]


def test_at_step_one_fast_finds_what_walking_every_batch_finds():
    # The capacity sits where a real step's demand does, with a margin: between the batch that
    # fits and the one that runs lie steps inside the margin or that ran only after a cache
    # flush. Fast must land on both boundaries exactly, in fewer probes than a walk. (Tiny
    # models' needs are staircases of 2 MiB segments, the estimate's worst case; real models'
    # probe counts are in benchmarks/sweep_cost.py.)
    from memorymark.backends.sim import SimBackend
    from memorymark.step.catalog import CatalogStep

    settings = Settings(model="tiny-bert", seq_len=32, gpu="a10", backend="sim")
    capacity = (
        SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=2**40))
        .measure(23)
        .demand_bytes
    )
    margin = capacity // 50
    answers, probes = [], []
    for strategy_cls in (FastStrategy, LinearStrategy):
        backend = SimBackend(
            CatalogStep(settings), policy=FitPolicy(capacity_bytes=capacity, margin_bytes=margin)
        )
        strategy = strategy_cls(
            step=1, max_batch=48, capacity_bytes=capacity, limit_bytes=capacity - margin
        )
        measurements = list(sweep(backend, strategy))
        fit, run = best_fit(measurements), best_fit(measurements, runs=True)
        answers.append((fit.batch_size, run.batch_size))
        probes.append(len(measurements))
    assert answers[0] == answers[1]
    assert answers[0][0] < answers[0][1]  # both boundaries were searched
    assert probes[0] < probes[1]


def test_a_corrected_estimate_probes_the_nearest_grid_point(function_backend):
    # What the device needs is 1.09x the live bytes: the first guess (135, where live bytes
    # reach the limit) does not fit, and its ratio puts the boundary at 123.985. The nearest
    # grid point is the answer and the one above shows it; rounding down probed 123 first.
    def need(batch):
        return int(1.09 * (50 + 7 * batch))

    backend = function_backend(affine_two_phases, 1000, required=need, demand=need)
    strategy = FastStrategy(step=1, capacity_bytes=1000, find_max=False)
    assert best_fit(list(sweep(backend, strategy))).batch_size == 124
    assert backend.tried == [2, 4, 135, 124, 125]


def test_the_maximum_is_searched_between_the_ratio_and_the_live_bytes(function_backend):
    # Past the recommended batch a step runs only after a cache flush, and the flushed need's
    # ratio to live bytes falls as the batch grows: lo's ratio lands short, and probing there
    # walked up one batch at a time (145, 146, 147, 149, 153, 150). Halfway to where live bytes
    # alone reach the capacity (152.9) lands on the maximum.
    def demand(batch):
        return int(1.05 * (50 + 7 * batch))

    def required(batch):
        flushed = int((50 + 7 * batch) * (1 + 0.3 / batch**0.5))
        return demand(batch) if demand(batch) <= 1120 else flushed

    backend = function_backend(affine_two_phases, 1000, 1120, required=required, demand=demand)
    strategy = FastStrategy(step=1, capacity_bytes=1120, limit_bytes=1000)
    measurements = list(sweep(backend, strategy))
    fit, run = best_fit(measurements), best_fit(measurements, runs=True)
    assert (fit.batch_size, run.batch_size) == (129, 149)
    assert backend.tried == [2, 4, 135, 129, 130, 149, 150]
