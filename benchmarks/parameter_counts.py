"""Prints the catalog's parameter counts, each counted by building the model on the meta device.

The lines are memorymark/models/parameter_counts.py's table: paste them there after a
transformers or torch upgrade moves a count (tests/test_cli_catalogs.py checks a sample).

    python benchmarks/parameter_counts.py
"""

from __future__ import annotations

from memorymark import models


def main() -> None:
    """One table line per catalog model and task, in catalog order."""
    for entry in models.CATALOG:
        for task in entry.tasks:
            count = models.count_parameters(entry, task)
            print(f'    ("{entry.key}", "{task}"): {count:_},')


if __name__ == "__main__":
    main()
