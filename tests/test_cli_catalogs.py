"""`memorymark models` and `memorymark gpus`: static lists that answer without torch, and the
shipped parameter counts they print, checked against the models built."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memorymark import models
from memorymark.models.parameter_counts import PARAMETERS

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

ROOT = Path(__file__).resolve().parents[1]


def test_models_and_gpus_answer_without_loading_torch():
    code = (
        "import contextlib, io, json, sys\n"
        "from memorymark.cli.parser import main\n"
        "out = io.StringIO()\n"
        "with contextlib.redirect_stdout(out):\n"
        "    status = main(['models', '--json']) + main(['gpus', '--json'])\n"
        "print(json.dumps([status, 'torch' in sys.modules, 'transformers' in sys.modules]))"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.splitlines()[-1]) == [0, False, False]


def test_the_models_table_prints_the_shipped_counts(capsys):
    from memorymark.cli.parser import main

    assert main(["models", "--json"]) == 0
    rows = {r["key"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["bert"]["parameters"] == 109_483_778
    assert rows["llama-3.1-70b"]["parameters"] == 70_553_706_496
    assert rows["tiny-resnet"]["parameters"] == 3_602


def test_every_catalog_model_and_task_has_a_shipped_count():
    wanted = {(e.key, task) for e in models.CATALOG for task in e.tasks}
    assert set(PARAMETERS) == wanted


@pytest.mark.parametrize(
    ("key", "task"),
    [
        ("bert", "sequence-classification"),
        ("gpt2", "causal-lm"),
        ("gpt2", "sequence-classification"),
        ("resnet", "image-classification"),
        ("t5-small", "seq2seq-lm"),
        ("vit", "image-classification"),
        ("llama-3.2-1b", "causal-lm"),
        ("llama-3.2-1b", "sequence-classification"),
        ("qwen3-30b-a3b", "causal-lm"),
        ("tiny-llama", "sequence-classification"),
    ],
)
def test_a_shipped_count_is_the_built_models_count(key, task):
    entry = models.find_model(key)
    assert PARAMETERS[(key, task)] == models.count_parameters(entry, task)


def test_a_model_outside_the_catalog_is_counted_by_building_it(tmp_path, any_config_path):
    config = json.loads((models.CONFIG_DIR / "tiny-bert.json").read_text())
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    entry = models.find_model(f"file:{path}")
    assert entry.source != "catalog"
    # Built, not looked up: a config file trains as a causal LM by default, the catalog's
    # tiny-bert as a classifier, so the heads differ.
    assert models.parameter_count(entry) == models.count_parameters(entry) == 55_432
