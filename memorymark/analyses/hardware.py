"""Ways out by hardware: the cheapest catalog GPU on which batch 1 trains, and the fewest GPUs
of the chosen kind that train it sharded with FSDP.

Each answer is a simulated batch-1 step on the very GPU (or GPU count) it names, so the peak a
way out states is what applying its settings measures. Counted states (the lower bound of
memorymark/backends/states.py) skip a GPU, or a GPU count, they already overflow, without a
step: under FSDP each rank holds at least 1/N of them (every parameter, gradient and optimizer
state is sharded). GPU counts are tried in the order a cluster offers them
(memorymark/distributed/topology.py) from the first the states allow, a few at most, then
memorymark/search/gpu_count.py's search takes the counts a fit through those steps says
may hold it; a step whose activations and logits alone pass the limit ends the search (they
are not sharded: no count helps); every count is judged as every
way out is: reserved bytes within usable memory (less NCCL's buffers) less the margin. Time is
estimated as scaling out estimates it (memorymark/analyses/scale_out.py: the step's FLOPs and
bytes on the roofline, the strategy's traffic over the catalog's links, overlapping).

Must not know how a step is measured: the caller passes `step(settings, gpu)`. No display.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

from memorymark import gpus
from memorymark.analyses.scale_out import row_from_report
from memorymark.backends import selection
from memorymark.distributed import topology
from memorymark.measurement import Measurement
from memorymark.report import Report
from memorymark.search import gpu_count
from memorymark.settings import Costs, Settings
from memorymark.ways_out import SAMPLES_PER_RUN, Fix

Step = Callable[[Settings, gpus.GPU], Measurement]
"""One simulated batch-1 step of the settings on a whole GPU (its ranks are the settings')."""

BIGGER_GPU = "a bigger GPU"
SEVERAL_GPUS = "several GPUs (FSDP)"
COUNTS_IN_ORDER = 2
"""GPU counts stepped one after another from the first the states allow, before a + b/n
through them picks the next: at batch 1 the states dominate, so the first or second usually
fits (Llama-3.1-70B on A10s: the first). Where neither does (its QLoRA: 2 and 3 do not, 6
does), the fit through them steps 7, 6 and 5, where a third count in order and one node's
stepped 4, 5, 8 and 6 (2 to 4 s each on a 2-core machine)."""


FAR_OFF = 2
"""How many times its limit the first count's batch 1 must need before the largest count is
stepped second: Llama-3.1-70B in fp32 needs 59.9 GiB of 21 on 56 A10s, where its states alone
just fit (1,051 GiB over 56), and no count trains it; its QLoRA needs little past the limit on 2
and trains on 4."""


def limit_bytes(settings: Settings, gpu: gpus.GPU) -> int:
    """What batch 1 must stay within on one rank of `settings` on `gpu`: usable memory (less
    NCCL's buffers on many GPUs) less the margin, as every sweep judges it."""
    return selection.fit_policy(settings, gpu).limit_bytes


def per_rank_states(settings: Settings, states: int) -> int:
    """A lower bound on the bytes one rank of `settings` holds of `states` (a model's weights,
    gradients and optimizer state, counted whole): all of them on one GPU or replicated (DDP,
    ZeRO-1), a 1/N share under FSDP over N ranks and the tensor and pipeline degrees' share of
    that (padding only adds), none when FSDP offloads them to the host."""
    hw = settings.hardware
    if hw.dist in topology.SHARDED and hw.offload != "none":
        return 0
    lay = hw.layout()
    ranks = lay.tp * lay.pp * (lay.dp_shard if hw.dist in topology.SHARDED else 1)
    return states // ranks


def cheapest_gpu(
    settings: Settings, chosen: gpus.GPU, step: Step, states: int, label: str = BIGGER_GPU
) -> Fix | None:
    """The cheapest catalog GPU (by its price per hour) with more usable memory than `chosen`
    on which batch 1 of `settings` fits; None when none does. `states` (bytes, the model's
    whole) bound the step's peak from below by a rank's share of them (`per_rank_states`): a
    GPU whose limit that passes is not stepped, nor one whose compute capability's step
    already peaked (live bytes, alike on every GPU of it) past it."""
    states = per_rank_states(settings, states)
    candidates = sorted(
        (g for g in gpus.CATALOG if g.usable_bytes > chosen.usable_bytes and g != chosen),
        key=lambda g: (g.usd_per_hour, g.usable_bytes),
    )
    live_by_arch: dict[tuple[int, int], int] = {}
    for gpu in candidates:
        try:  # what a Session refuses on this GPU: bf16 or FlashAttention-2 before Ampere
            gpu.check_precision(settings.workload.precision)
            gpu.check_attention(settings.workload.attention)
        except ValueError:
            continue
        variant = settings.replace(gpu=gpu.name, gpu_memory_gib=None)
        limit = limit_bytes(variant, gpu)
        if states > limit or live_by_arch.get(gpu.compute_capability, 0) > limit:
            continue
        m = step(variant, gpu)
        live_by_arch[gpu.compute_capability] = m.peak_bytes
        if required(m) <= limit:
            return _fix(label, variant, gpu, m, limit, parameters=0)
    return None


def fewest_gpus(
    settings: Settings,
    gpu: gpus.GPU,
    step: Step,
    states: int,
    parameters: int,
    label: str = SEVERAL_GPUS,
) -> Fix | None:
    """The fewest GPUs of `gpu`'s kind (of the counts a cluster offers, more than the settings
    use) on which batch 1 of `settings` fits sharded with FSDP; the largest count stepped, as
    still too big, when none does; None when FSDP does not apply (inference, a setting it does
    not take) or no count is left. `parameters` prices the traffic."""
    if settings.workload.forward_only:
        return None
    dist = (
        settings.hardware.dist if settings.hardware.dist in ("fsdp", "fsdp-no-reshard") else "fsdp"
    )
    offload = settings.hardware.offload if dist == settings.hardware.dist else "none"
    try:
        base = settings.replace(dist=dist, offload=offload, gpus="2", nodes=None)
    except ValueError:
        return None

    def limit(n: int) -> int:
        try:
            return limit_bytes(gpu_count.with_gpus(base, n), gpu)
        except ValueError:
            return -1  # NCCL's buffers leave a rank no room at all: no count to try

    # Each rank holds at least 1/n of the sharded states (none of them, offloaded to the host).
    sharded = states if offload == "none" else 0
    already = settings.hardware.gpu_count or 1
    counts = [n for n in topology.cluster_counts() if n > already and sharded <= n * limit(n)]
    steps: dict[int, Measurement] = {}

    def fits(s: Settings) -> Measurement:
        n = s.hardware.gpu_count or 1
        m = step(s, gpu)
        # Judged as every way out is (within the limit, margin kept), not only "runs".
        within = required(m) <= limit(n)
        steps[n] = replace(m, runs=within, fits=within and m.fits)
        return steps[n]

    found = None
    for i, n in enumerate(counts[:COUNTS_IN_ORDER]):
        if fits(gpu_count.with_gpus(base, n)).runs:
            found = n
            break
        if _unsharded(steps[n]) > limit(counts[-1]):
            break  # no count trains it
        if i == 0 and required(steps[n]) > FAR_OFF * limit(n) and len(counts) > COUNTS_IN_ORDER:
            # Far off where the states alone just fit: the most GPUs say whether any count
            # can (a step on 1,024 fake ranks costs about what one on 64 does).
            if not fits(gpu_count.with_gpus(base, counts[-1])).runs:
                break
        if len(steps) >= 2 and not _reachable(counts[i + 1 :], steps, limit):
            break  # what stays at every count already passes the limit: no count trains it
    else:
        rest = _reachable(counts[COUNTS_IN_ORDER:], steps, limit)
        if rest:
            found = gpu_count.min_gpus(base, fits, rest, limit, known=steps).min_gpus
    if not steps:
        return None
    n = found or max(steps)
    return _fix(label, gpu_count.with_gpus(base, n), gpu, steps[n], limit(n), parameters)


def _unsharded(m: Measurement) -> int:
    """Bytes of a step's peak that every count holds alike: the batch's activations and
    logits (the same forward on each rank), a lower bound on any count's step. What else
    stays (FSDP2 keeps the root module's parameters gathered after forward) is not known
    apart from what shrinks (foreach AdamW's temporaries are the size of a shard)."""
    b = m.breakdown
    return 0 if b is None else b.activations + b.logits


def _reachable(
    counts: list[int], steps: dict[int, Measurement], limit: Callable[[int], int]
) -> tuple[int, ...]:
    """The counts left to search, up to twice the first that a + b/n, through the last two
    counts stepped, says fits (what is sharded falls as 1/n, the rest stays); none when even
    the most GPUs would not hold the rest. Keeps the search off 1024-rank steps it can skip."""
    if len(steps) < 2 or not counts:
        return tuple(counts)
    (n1, m1), (n2, m2) = sorted(steps.items())[-2:]
    needs_at = gpu_count.fitted_needs((n1, _needs(m1)), (n2, _needs(m2)))
    first = next((n for n in counts if needs_at(n) <= limit(n)), None)
    return () if first is None else tuple(n for n in counts if n <= 2 * first)


def _needs(m: Measurement) -> int:
    """What a simulated step needs with no cache flush (`Measurement.needs_bytes`)."""
    assert m.needs_bytes is not None
    return m.needs_bytes


def required(m: Measurement) -> int:
    """What the device must hold for a simulated step: it always traces to its end, so it
    always says."""
    assert m.required_bytes is not None
    return m.required_bytes


def _fix(
    label: str, settings: Settings, gpu: gpus.GPU, m: Measurement, limit: int, parameters: int
) -> Fix:
    fits = required(m) <= limit
    return Fix(
        label=label,
        settings=settings,
        gpu=gpu,
        peak_bytes=m.peak_bytes,
        required_bytes=required(m),
        limit_bytes=limit,
        hardware=True,
        samples_per_second=samples_per_second(settings, gpu, m, parameters) if fits else None,
    )


def samples_per_second(
    settings: Settings, gpu: gpus.GPU, m: Measurement, parameters: int
) -> float | None:
    """Estimated samples/s over every GPU of `settings` on `gpu` from its batch-1 step `m`
    (compute from the step's FLOPs and bytes, communication from the strategy's traffic for
    `parameters` parameters, overlapping); None when the step has no throughput, or its
    traffic crosses nodes of a GPU with no network bandwidth in the catalog."""
    if m.samples_per_second is None:
        return None
    # Scaling out's own estimate of a count's run, so the two never disagree, read from a
    # report of this one probe (it fits: the caller judged it against the way out's limit).
    one_probe = Report(
        settings=settings,
        costs=Costs(),
        gpu=selection.rank_gpu(settings, gpu),
        backend=m.backend,
        measurements=(replace(m, fits=True),),
        elapsed_seconds=0.0,
    )
    try:
        row = row_from_report(one_probe, parameters, SAMPLES_PER_RUN, gpu.usd_per_hour)
    except ValueError:
        return None  # across nodes, on a GPU whose network the catalog does not know
    return row.samples_per_second
