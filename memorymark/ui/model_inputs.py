"""The sidebar's model choice: the catalog, another model by spec, an uploaded config.json, and the
inputs that depend on the model (task, sequence length or image size).

Owns which settings apply to which model (no image size for GPT-2, no attention choice for an
image model, no checkpointing switch in torchvision) and where an upload is written on this
server. Must not know how a sweep runs or how results are drawn.
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path
from typing import Any

import streamlit as st

from memorymark import models
from memorymark.models import sources
from memorymark.settings import Settings
from memorymark.ui import sweep_runner
from memorymark.ui.state_keys import key

UPLOAD_KEY = "mm_upload"
DEFAULTS = Settings()
SPEC_HELP = (
    "hf:ORG/NAME (only its config.json is fetched from the hub), timm:NAME or "
    "torchvision:NAME (random weights); for a config.json, use the upload below"
)
# Links and text boxes must not make a hosted app read arbitrary server paths.
sources.restrict_config_files(sources.UPLOAD_DIR)


COUNT_WAIT_SECONDS = 2.0
"""How long the sidebar waits for a parameter count; one that lands later shows at the next run."""


@st.cache_resource(show_spinner=False)
def _parameter_counts() -> sweep_runner.ResultCache:
    """Every session's parameter counts (futures), by (model, task)."""
    return sweep_runner.ResultCache(size=256)


def parameter_count(model: str, task: str) -> int | None:
    """Parameters of a model, counted once per server process on the meta device by a worker
    (torch stays out of the server); None while the count is on its way."""
    counts = _parameter_counts()
    future: cf.Future | None = counts.get((model, task))
    if future is None:
        future = sweep_runner.page_service().parameter_count(model, task)
        counts.put((model, task), future)
    try:
        return future.result(timeout=COUNT_WAIT_SECONDS)
    except cf.TimeoutError:
        return None


def chosen_entry() -> models.ModelEntry | None:
    """The model the sidebar names (its text box first), or None if it names none."""
    spec = str(st.session_state.get(key("model_spec"), "")).strip()
    try:
        return models.find_model(spec or st.session_state[key("model")])
    except ValueError:
        return None


def applicable(entry: models.ModelEntry) -> dict[str, bool]:
    """Which model-dependent settings mean something for `entry`."""
    text = entry.input_kind == "text"
    return {
        "seq_len": text,
        "image_size": not text,
        "attention": text,
        "kernels": entry.default_task == models.CAUSAL_LM,
        "checkpointing": entry.source != "torchvision",
        # bitsandbytes quantizes transformers' linear layers (memorymark/step/quantization.py).
        "quantization": entry.source not in ("timm", "torchvision"),
        "double_quant": entry.source not in ("timm", "torchvision"),
    }


def unused_defaults(entry: models.ModelEntry) -> dict[str, Any]:
    """The settings that mean nothing for `entry`, at their defaults: a choice made for another
    model neither changes this run nor its cached result, and stays out of the link."""
    defaults = DEFAULTS.to_dict()
    return {name: defaults[name] for name, used in applicable(entry).items() if not used}


def save_upload(name: str, data: bytes, root: Path | None = None) -> str:
    """Write an uploaded config.json where the engine reads it (under `root`, else the engine's
    upload folder) and return its `upload:NAME` spec: one folder per content, named after the
    upload, so the same upload gives the same spec and cached result. The spec names no server
    path, so the text box, links and messages show none."""
    return f"upload:{sources.save_config(Path(name).stem, data, root).name}"


def _on_upload() -> None:
    """Upload callback: the saved file becomes the model spec; clearing it clears the spec."""
    upload = st.session_state.get(UPLOAD_KEY)
    spec = str(st.session_state.get(key("model_spec"), ""))
    if upload is not None:
        st.session_state[key("model_spec")] = save_upload(upload.name, upload.getvalue())
    elif spec.startswith(("upload:", f"file:{sources.UPLOAD_DIR}")):
        st.session_state[key("model_spec")] = ""


def _upload_input(sb: Any, spec: str) -> None:
    with sb.expander("Upload a config.json", expanded=False):
        st.file_uploader(
            "Any transformers config.json",
            type=["json"],
            key=UPLOAD_KEY,
            on_change=_on_upload,
            help="Only the architecture is read: the model is built with random weights.",
        )
    if spec.startswith(("file:", "upload:")):
        sb.caption(
            "An uploaded or file: model is kept on this server: a shared link opens it only "
            "here, and only while the file exists. Share the config.json itself with others."
        )


def _size_inputs(sb: Any, entry: models.ModelEntry) -> None:
    if entry.input_kind == "image":
        sb.number_input("Image size (pixels per side)", min_value=8, step=16, key=key("image_size"))
        return
    top = entry.max_positions or 1_000_000
    st.session_state[key("seq_len")] = min(int(st.session_state[key("seq_len")]), top)
    sb.number_input(
        f"Sequence length (tokens, at most {top})",
        min_value=1,
        max_value=top,
        step=32,
        key=key("seq_len"),
    )


TASK_FOR_KEY = "mm_task_for"
"""The model the task widget's value was chosen for: another model starts from its own default
(GPT-2 after BERT trains causal-lm, not the classification BERT left behind)."""


def _task_input(sb: Any, entry: models.ModelEntry, spec: str) -> str:
    chosen_for = spec or st.session_state[key("model")]
    stale = st.session_state.get(TASK_FOR_KEY, chosen_for) != chosen_for
    if stale or st.session_state.get(key("task")) not in entry.tasks:
        st.session_state[key("task")] = entry.default_task
    st.session_state[TASK_FOR_KEY] = chosen_for
    if len(entry.tasks) > 1:
        sb.selectbox("Task", entry.tasks, key=key("task"))
    task = st.session_state[key("task")]
    try:
        count = parameter_count(spec or st.session_state[key("model")], task)
    except Exception:  # noqa: BLE001 - the count is a nicety; Settings reports real problems
        count = None
    sb.caption(task if count is None else f"{count / 1e6:,.1f}M parameters · {task}")
    return task


def model_inputs(sb: Any) -> tuple[dict[str, Any], models.ModelEntry | None]:
    """Draw the model widgets; return their Settings values and the chosen entry (None: invalid)."""
    model = sb.selectbox(
        "Model",
        models.model_keys(),
        key=key("model"),
        format_func=lambda k: models.find_model(k).display_name,
    )
    spec = sb.text_input(
        "...or another model", key=key("model_spec"), help=SPEC_HELP,
        placeholder="hf:ORG/NAME or timm:NAME",
    ).strip()  # fmt: skip
    _upload_input(sb, spec)
    entry = chosen_entry()
    if entry is None:
        return {"model": spec}, None  # Settings says what is wrong, as an st.error
    task = _task_input(sb, entry, spec)
    _size_inputs(sb, entry)
    values = {"model": spec or model, "task": None if task == entry.default_task else task}
    return values | unused_defaults(entry), entry
