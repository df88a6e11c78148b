"""Each simulation rule names the torch releases it was verified on; a report says when the
installed torch is outside them (issue 8: the PyTorch you run)."""

import json

import pytest

from memorymark import gpus
from memorymark.cuda_rules import versions
from memorymark.report import Report
from memorymark.reporting.json_form import report_to_dict
from memorymark.settings import Costs, Settings

pytestmark = pytest.mark.fast  # in `make test-fast` (tests/test_fast_subset.py)

# The releases the suite runs on, and the rules each has not been verified with (RULES says why).
UNVERIFIED_ON = {(2, 13): (), (2, 14): ("SDPA kernel choice", "caching allocator")}


def test_the_suite_runs_on_a_release_whose_unverified_rules_are_known():
    assert versions.release() in UNVERIFIED_ON
    assert versions.unverified_rules() == UNVERIFIED_ON[versions.release()]


def test_2_14_is_verified_but_for_the_sdpa_choice_and_the_allocator():
    assert versions.unverified_rules("2.13.0+cpu") == ()
    assert versions.unverified_rules("2.14.1+cu130") == UNVERIFIED_ON[(2, 14)]
    assert versions.unverified_rules("2.14.0") == UNVERIFIED_ON[(2, 14)]


def test_a_newer_torch_names_the_rules_it_touches():
    names = versions.unverified_rules("2.15.1+cu130")
    assert "SDPA kernel choice" in names and "CUDA autocast op lists" in names
    assert "cuBLAS workspaces" not in names  # read up to 2.15
    assert "cuBLAS workspaces" in versions.unverified_rules("2.16.0")


@pytest.mark.parametrize(
    ("text", "release"), [("2.13.0+cpu", (2, 13)), ("2.15.0.dev2026", (2, 15))]
)
def test_release_reads_major_and_minor(text, release):
    assert versions.release(text) == release


def test_release_of_garbage_is_one_line():
    with pytest.raises(ValueError, match="not a torch version"):
        versions.release("nightly")


def test_the_report_says_which_rules_rest_on_another_release():
    report = Report(
        settings=Settings(), costs=Costs(), gpu=gpus.find_gpu("a10"), backend="sim",
        measurements=(), elapsed_seconds=0.0, torch_version="2.15.0",
        unverified_rules=versions.unverified_rules("2.15.0"),
    )  # fmt: skip
    d = json.loads(json.dumps(report_to_dict(report)))
    assert d["torch_version"] == "2.15.0"
    assert "SDPA kernel choice" in d["rules_unverified"]
    assert d["rules_note"].startswith("PyTorch 2.15.0 is outside the releases")
