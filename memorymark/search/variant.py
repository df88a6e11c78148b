"""A sweep over another axis than the batch: one setting varied at a fixed training batch.

The sweep generator and the strategies (memorymark/search/sweep.py, strategies.py) search any
integer axis whose memory grows with it; they call it "batch size". `VariantMeasurer` hands them
the values of one setting (a sequence length, an eval batch) as that axis: each probe gives the
same resident model and optimizer state the step those settings describe, measures it at the
fixed training batch, keeps the measurement as taken (`probes`) and hands the sweep a copy
relabelled with the value. Subclasses say what the sweep reads from it. This module knows nothing
about how a step is measured or displayed.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from memorymark.accounting.symbolic import Replays, StepRecord
from memorymark.measurement import Measurement
from memorymark.settings import Settings


class VariantMeasurer:
    """A backend seen by the sweep as measuring the values of `field` at one training batch."""

    field = ""
    """The setting varied (a subclass names it)."""

    def __init__(self, backend: Any, settings: Settings, batch_size: int) -> None:
        from memorymark.step.catalog import CatalogStep  # torch loads with the backend, not here

        self._backend = backend
        self._settings = settings
        self._make_step = CatalogStep
        self.batch_size = batch_size
        self.probes: dict[int, Measurement] = {}
        """Each probed value's measurement, as the backend took it (`kept`)."""

    def measure(self, value: int) -> Measurement:
        """One step at the fixed batch with the setting at `value`, relabelled with it."""
        settings = self._settings.replace(**{self.field: value})
        self._backend.training_step = self._make_step(settings)
        measurement = self._backend.measure(self.batch_size)
        self.probes[value] = self.kept(measurement)
        return self.relabelled(measurement, value)

    def keep_records(self) -> Replays:
        """The backend's records, by this axis's values, for the symbolic strategy
        (memorymark/accounting/symbolic.py `Replays`); call before the first probe."""
        self._backend.keep_records()

        def at(value: int, record: StepRecord) -> Measurement:
            measurement = self._backend.measurement_of(self.batch_size, record)
            self.probes[value] = self.kept(measurement)
            return self.relabelled(measurement, value)

        return Replays(at, lambda: self._backend.last_record)

    def kept(self, measurement: Measurement) -> Measurement:
        """What `probes` keeps of a probe's measurement (all of it, unless a subclass says)."""
        return measurement

    def relabelled(self, measurement: Measurement, value: int) -> Measurement:
        """The measurement as the sweep reads it: `value` where it reads a batch size."""
        return replace(measurement, batch_size=value)

    def release(self) -> None:
        """Release the backend (the sweep calls this however it ends)."""
        self._backend.release()
