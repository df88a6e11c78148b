"""How long a simulated sweep will take, estimated from the model's config before anything is built.

Owns the estimate (layers and labels of a transformers config.json, timed per layer on this
project's reference machine) and the refusal of a model whose shortest sweep cannot finish within
the settings' time limit, in one line, before the first probe. Parameters do not enter: fake
tensors do no arithmetic, so a probe's cost follows the number of operators (layers), not their
sizes (below: Llama-3.2-1B's 1.2B parameters over 16 layers cost what BERT-base's 110M over 12
do, per layer). Knows nothing of backends or search; never imports torch.
"""

from __future__ import annotations

from typing import Any

from memorymark import models
from memorymark.models import config_checks
from memorymark.models.depth import replayed_plan
from memorymark.settings import Settings

# Seconds per transformer layer of a simulated probe, timed on the 2-core CPU machine this was
# written on (torch 2.13, transformers 5.23; bert-base 12 layers, bert-large 24, gpt2 12,
# llama-3.2-1b 16, seq 128, batch 8 then 16): the first probe (which also builds the model on
# fake tensors) took 0.15-0.20 s a layer, each later one 0.046-0.076 s. The larger of each is used,
# so the estimate leans long.
FIRST_PROBE_SECONDS_PER_LAYER = 0.20
LATER_PROBE_SECONDS_PER_LAYER = 0.076
# transformers builds an id2label dict entry per label (about a microsecond each in CPython).
SECONDS_PER_LABEL = 1e-6
SHORTEST_SWEEP_PROBES = 3
"""The symbolic and fast strategies' least: two traces and the traced answer."""
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers",
               "encoder_layers", "decoder_layers", "depths")  # fmt: skip


def layer_count(config: dict[str, Any]) -> int:
    """Blocks a config describes: per (sub-)config, its layer keys added up (an encoder and a
    decoder both count), the largest such sum."""
    best = 0
    for d in config_checks.all_objects(config):
        total = 0
        for k in _LAYER_KEYS:
            value = d.get(k)
            values = value if isinstance(value, list) else [value]
            total += sum(v for v in values if isinstance(v, int) and not isinstance(v, bool))
        best = max(best, total)
    return best


def sweep_seconds(
    config: dict[str, Any], labels: int, probes: int, *, replay_depth: bool = False
) -> float:
    """Estimated seconds of a simulated sweep of `probes` probes of this config. With
    `replay_depth`, where the depth replay holds (memorymark/backends/depth_replay.py), a
    probe traces the model built shallower: four depths at the first, two at each later one."""
    first_layers = later_layers = max(layer_count(config), 1)
    plan = replayed_plan(config) if replay_depth else None
    if plan is not None:
        depths = plan.depths()
        first_layers, later_layers = sum(depths), depths[1] + depths[2]
    first = FIRST_PROBE_SECONDS_PER_LAYER * first_layers + SECONDS_PER_LABEL * labels
    return first + (probes - 1) * LATER_PROBE_SECONDS_PER_LAYER * later_layers


def check_time_limit(settings: Settings, entry: models.ModelEntry) -> None:
    """Refuse (ValueError, one line) a simulated model (`entry`, the settings' model) whose
    shortest sweep is estimated to take longer than `settings.search.time_limit_seconds`;
    models with no config.json (timm, torchvision) are not estimated."""
    limit = settings.search.time_limit_seconds
    if limit is None:
        return
    config = models.config_of(entry)
    if config is None:
        return
    replay = settings.search.depth == "replay"
    estimate = sweep_seconds(config, entry.num_labels, SHORTEST_SWEEP_PROBES, replay_depth=replay)
    if estimate > limit:
        raise ValueError(
            f"{entry.display_name} ({layer_count(config)} layers) would take about "
            f"{estimate:.0f} s to simulate its shortest sweep ({SHORTEST_SWEEP_PROBES} probes, "
            f"estimated): more than the time limit of {limit:g} s"
        )
