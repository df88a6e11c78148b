"""Property tests: whatever text reaches a link, a flag or a config.json, the answer is a valid
object or a one-line refusal (exit status 2), never another exception."""

from __future__ import annotations

import contextlib
import io
import json
import math

import pytest
from config_samples import TINY_BERT
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from memorymark.cli import commands, parser
from memorymark.models import sources
from memorymark.reporting.markdown import escape
from memorymark.settings import COST_NAMES, FIELD_NAMES, Costs, Settings, check_model

# Modest example counts: the whole file runs in seconds on 2 cores.
FEW = settings(
    max_examples=60,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
HOSTILE_NUMBERS = st.sampled_from(
    ["nan", "NaN", "inf", "-inf", "1e400", "-1e400", "1e308", "1e9", "0", "-1", "1.5", "0x10",
     "1_000", " 7 ", "9" * 5000, "-" + "9" * 400, "", "None", "true", "1e-400", "2%", "1GiB"]
)  # fmt: skip
ANY_TEXT = st.one_of(HOSTILE_NUMBERS, st.text(max_size=40), st.integers().map(str))


@pytest.fixture(autouse=True, scope="module")
def no_hub_and_any_path():
    """No request leaves the test (a generated `hf:a/b` is refused offline), and file: specs
    are not limited to the app's upload folder."""
    import huggingface_hub

    def offline(*args, **kwargs):
        raise OSError("offline in tests")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(huggingface_hub, "get_hf_file_metadata", offline)
        mp.setattr(huggingface_hub, "hf_hub_download", offline)
        before = sources._config_root
        sources.restrict_config_files(None)
        yield
        sources.restrict_config_files(before)


def one_line_refusal(exc: ValueError) -> None:
    message = str(exc)
    # One line, of a length a terminal shows whole: an unknown model's list of the catalog's
    # keys alone is about 280 characters, and a hostile name is shown shortened.
    assert message and "\n" not in message and len(message) < 400, message


def query(cls: type) -> st.SearchStrategy[dict[str, str]]:
    names = [*(FIELD_NAMES if cls is Settings else COST_NAMES), "unknown"]
    return st.dictionaries(st.sampled_from(names), ANY_TEXT, max_size=6)


@FEW
@given(query(Settings))
def test_settings_from_any_link_are_valid_or_one_line(params):
    try:
        s = Settings.from_query(params)
    except ValueError as exc:
        one_line_refusal(exc)
        return
    assert 1 <= s.workload.seq_len <= 2**20 and 1 <= s.search.max_batch <= 2**20
    assert Settings.from_query(s.to_query()) == s  # what was accepted round-trips


@FEW
@given(query(Costs))
def test_costs_from_any_link_are_valid_or_one_line(params):
    try:
        c = Costs.from_query(params)
    except ValueError as exc:
        one_line_refusal(exc)
        return
    assert all(math.isfinite(v) for v in (c.hours_per_run, c.runs_per_year))
    assert c.usd_per_hour is None or 0 <= c.usd_per_hour <= 1000


NUMERIC_FLAGS = {
    "analyze": ["--seq-len", "--image-size", "--lora-rank", "--gpu-memory", "--max-grad-norm",
                "--grad-accum", "--step", "--current-batch", "--max-batch", "--target-batch",
                "--margin", "--price", "--hours-per-run", "--runs-per-year"],
    "measure": ["--batch-size", "--seq-len", "--lora-rank", "--grad-accum", "--gpu-memory"],
}  # fmt: skip


class Reached(Exception):
    """The engine was reached: every flag was accepted."""


@pytest.fixture(scope="module")
def engine_stub():
    """The engine's entry points stubbed: each reports that the settings were accepted (exit 1
    through StepError), so a case costs parsing and validation only."""

    def reached(*args, **kwargs):
        raise commands.StepError("reached the engine")

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(commands, "Session", reached)
        yield


@FEW
@given(
    st.sampled_from(sorted(NUMERIC_FLAGS)).flatmap(
        lambda command: st.tuples(
            st.just(command),
            st.dictionaries(st.sampled_from(NUMERIC_FLAGS[command]), ANY_TEXT, max_size=4),
        )
    )
)
def test_the_cli_answers_any_flag_value_with_0_1_or_2(engine_stub, case):
    command, flags = case
    argv = [command, "tiny-bert"] + [f"{flag}={value}" for flag, value in flags.items()]
    if command == "measure" and "--batch-size" not in flags:
        argv.append("--batch-size=1")
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        try:
            status = parser.main(argv)
        except SystemExit as done:  # argparse's refusals
            status = done.code
    err = stderr.getvalue()
    event(f"exit {status}")
    assert status in (1, 2), (argv, err)
    assert len(err.splitlines()) == 1 and len(err) < 400, err
    if status == 1:
        assert "reached the engine" in err


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
CONFIG_KEYS = ["architectures", "id2label", "label2id", "num_labels", "hidden_size",
               "num_hidden_layers", "num_attention_heads", "intermediate_size", "vocab_size",
               "max_position_embeddings", "n_positions", "hidden_act", "text_config",
               "hidden_sizes", "depths", "image_size"]  # fmt: skip


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("configs")


@FEW
@given(
    st.dictionaries(st.sampled_from(CONFIG_KEYS), JSON, max_size=3),
    st.one_of(st.sampled_from(["bert", "gpt2", "llama", "resnet", "vit", "nope", ""]), JSON),
)
def test_any_json_in_a_configs_known_keys_is_accepted_or_one_line(config_dir, changes, model_type):
    path = config_dir / "config.json"
    path.write_text(json.dumps({**TINY_BERT, **changes, "model_type": model_type}))
    sources.from_config_file.cache_clear()
    try:
        check_model(Settings(model=f"file:{path}"))  # reads the file, as a Session does
    except ValueError as exc:
        one_line_refusal(exc)


@settings(max_examples=200, deadline=None, database=None)
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs", "Cc")), max_size=60))
def test_plain_text_always_renders_as_typed(text):
    line = " ".join(text.split())
    out = MarkdownIt("commonmark").render(escape(text, every_punctuation=True))
    for char, entity in (("&", "&amp;"), ("<", "&lt;"), (">", "&gt;"), ('"', "&quot;")):
        line = line.replace(char, entity)  # markdown-it's escapeHtml
    assert out == (f"<p>{line}</p>\n" if line else "")
