"""What a training run costs: the price inputs only the report reads, never the sweep.

Kept apart from `Settings` so a price slider re-prices a finished sweep without re-running it.
Must not know: the sweep, torch, or how anything is shown.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any

from memorymark import limits
from memorymark.settings import codecs
from memorymark.settings.choices import field_types, validate


@dataclass(frozen=True, slots=True, kw_only=True)
class Costs:
    """What a training run costs: the report's inputs, never the sweep's."""

    usd_per_hour: float | None = None
    """Price of one GPU-hour; None takes the GPU catalog's default."""
    hours_per_run: float = 2.0
    """Wall-clock hours of one training run at the current batch size."""
    runs_per_year: float = 100.0
    """Training runs per year."""

    def __post_init__(self) -> None:
        validate(self)
        if self.usd_per_hour is not None:
            limits.check_range("usd_per_hour", self.usd_per_hour, 0, limits.MAX_USD_PER_HOUR,
                               "over 100x the dearest catalog GPU")  # fmt: skip
        limits.check_range("hours_per_run", self.hours_per_run, 0, limits.MAX_HOURS_PER_RUN,
                           "a leap year")  # fmt: skip
        limits.check_range("runs_per_year", self.runs_per_year, 0, limits.MAX_RUNS_PER_YEAR,
                           "one every five minutes")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of every field."""
        return dataclasses.asdict(self)

    def to_query(self) -> dict[str, str]:
        """URL query parameters for the fields that differ from the defaults."""
        return codecs.to_query(self.to_dict(), Costs().to_dict())

    @classmethod
    def from_query(cls, params: Mapping[str, str]) -> Costs:
        """Parse URL query parameters (strings); unknown keys are ignored, bad values raise."""
        return cls(**codecs.parse_query(field_types(Costs), params))


COST_NAMES: tuple[str, ...] = tuple(f.name for f in fields(Costs))
