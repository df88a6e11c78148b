"""The sidebar every page shares: training settings and the cost calculator, kept in the URL.

Owns the widgets, their session-state keys (`mm_<field>`), and the round trip between widgets,
`Settings`/`Costs` and the query string (`?model=gpt2&gpu=T4`), so a shared link opens the same
configuration on any page. Must not know how a sweep runs or how results are drawn.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any

import streamlit as st

from memorymark import gpus, models
from memorymark import settings as settings_mod
from memorymark.devices import DEFAULT_SIMULATED_GPU, local_gpu
from memorymark.gpus import GPU
from memorymark.settings import Costs, Settings

LOCAL = "this machine"
CUSTOM = "custom"
DEFAULT_CUSTOM_GIB = 24.0
# Slider ends: a week of GPU time per run, and more than one run a day. A link may ask for more;
# the slider then stretches to hold it.
HOURS_MAX, RUNS_MAX = 168.0, 500.0
SETTING_FIELDS = tuple(f.name for f in fields(Settings))
COST_FIELDS = tuple(f.name for f in fields(Costs))
STATE_KEYS = (*SETTING_FIELDS, *COST_FIELDS, "gpu_choice", "price_for", "model_spec")


def key(name: str) -> str:
    """The session-state key of one sidebar value."""
    return f"mm_{name}"


@st.cache_resource(show_spinner=False)
def detected_gpu() -> GPU | None:
    """This machine's CUDA GPU, asked once per server process."""
    return local_gpu()


@st.cache_resource(show_spinner=False)
def parameter_count(model: str, task: str) -> int:
    """Parameters of a catalog model, counted once on the meta device (the cached model loader)."""
    return models.parameter_count(models.find_model(model), task)


def _gpu_choice(s: Settings) -> str:
    if s.gpu_memory_gib is not None:
        return CUSTOM
    if s.gpu is None:
        return LOCAL if detected_gpu() else DEFAULT_SIMULATED_GPU
    return gpus.find_gpu(s.gpu).name


def _seed_from_url() -> None:
    """Fill the widgets' state from the query string, once per browser session."""
    if st.session_state.get(key("seeded")):
        return
    st.session_state[key("seeded")] = True
    params, errors = st.query_params.to_dict(), []
    try:
        s = Settings.from_query(params)
        choice = _gpu_choice(s)
    except ValueError as exc:
        errors.append(str(exc))
        s, choice = Settings(), _gpu_choice(Settings())
    try:
        c = Costs.from_query(params)
    except ValueError as exc:
        errors.append(str(exc))
        c = Costs()
    values: dict[str, Any] = {**s.to_dict(), **c.to_dict()}
    values["task"] = s.resolved_task
    spec = ":" in s.model  # hf:, timm:, torchvision: models go in the text box
    values["model"], values["model_spec"] = (Settings().model, s.model) if spec else (s.model, "")
    values["gpu_memory_gib"] = s.gpu_memory_gib or DEFAULT_CUSTOM_GIB
    values["gpu_choice"] = choice
    values["price_for"] = choice if c.usd_per_hour is not None else None
    for name, value in values.items():
        st.session_state[key(name)] = value
    st.session_state[key("url_errors")] = errors


def _keep_alive() -> None:
    # Streamlit forgets a widget's value on a page that does not draw it; re-assigning the
    # value at the top of every page keeps the choice when the user switches pages.
    for name in STATE_KEYS:
        if key(name) in st.session_state:
            st.session_state[key(name)] = st.session_state[key(name)]


def _gpu_label(choice: str) -> str:
    local = detected_gpu()
    if choice == LOCAL and local is not None:
        return f"{local.name}: this machine (measured)"
    if choice == CUSTOM:
        return "Custom memory size (simulated)"
    gpu = gpus.find_gpu(choice)
    how = "measured" if local is not None and local.name == gpu.name else "simulated"
    return f"{gpu.name}, {gpu.total_gib:.0f} GiB ({how})"


def _selected_gpu(choice: str, custom_gib: float) -> GPU:
    local = detected_gpu()
    if choice == LOCAL and local is not None:
        return local
    if choice == CUSTOM:
        return gpus.custom_gpu(custom_gib)
    return gpus.find_gpu(choice)


def _chosen_entry() -> models.ModelEntry | None:
    """The model the sidebar names (its text box first), or None if it names none."""
    spec = str(st.session_state.get(key("model_spec"), "")).strip()
    try:
        return models.find_model(spec or st.session_state[key("model")])
    except ValueError:
        return None


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


def _model_inputs(sb: Any) -> dict[str, Any]:
    model = sb.selectbox(
        "Model",
        models.model_keys(),
        key=key("model"),
        format_func=lambda k: models.find_model(k).display_name,
    )
    spec = sb.text_input(
        "...or another model", key=key("model_spec"), placeholder="hf:ORG/NAME or timm:NAME",
        help="hf:ORG/NAME (only its config.json is fetched), timm:NAME or torchvision:NAME",
    ).strip()  # fmt: skip
    entry = _chosen_entry()
    if entry is None:
        return {"model": spec}  # Settings says what is wrong, as an st.error
    if st.session_state.get(key("task")) not in entry.tasks:
        st.session_state[key("task")] = entry.default_task
    _size_inputs(sb, entry)
    task = st.session_state[key("task")]
    try:
        sb.caption(f"{parameter_count(spec or model, task) / 1e6:,.1f}M parameters")
    except Exception:  # noqa: BLE001 - the count is a nicety; Settings reports real problems
        pass
    return {"model": spec or model, "task": None if task == entry.default_task else task}


def _gpu_inputs(sb: Any) -> tuple[dict[str, Any], GPU]:
    local = detected_gpu()
    options = ([LOCAL] if local else []) + gpus.gpu_names() + [CUSTOM]
    if st.session_state.get(key("gpu_choice")) not in options:
        st.session_state[key("gpu_choice")] = LOCAL if local else DEFAULT_SIMULATED_GPU
    choice = sb.selectbox("GPU", options, key=key("gpu_choice"), format_func=_gpu_label)
    custom_gib = DEFAULT_CUSTOM_GIB
    if choice == CUSTOM:
        custom_gib = sb.number_input(
            "GPU memory (GiB, as PyTorch reports it)",
            min_value=1.0,
            max_value=gpus.MAX_CUSTOM_GIB,
            key=key("gpu_memory_gib"),
        )
    if local is None:
        sb.caption(
            f"No GPU on this machine: every figure is simulated on fake tensors "
            f"(default: {DEFAULT_SIMULATED_GPU})."
        )
    values = {
        "gpu": None if choice in (LOCAL, CUSTOM) else choice,
        "gpu_memory_gib": float(custom_gib) if choice == CUSTOM else None,
    }
    return values, _selected_gpu(choice, custom_gib)


def _training_inputs(sb: Any) -> None:
    sb.selectbox("Optimizer", settings_mod.OPTIMIZERS, key=key("optimizer"))
    sb.selectbox(
        "Precision",
        settings_mod.PRECISIONS,
        key=key("precision"),
        help="Lightning's names: autocast (-mixed) or weights in bf16 (bf16-true)",
    )
    sb.radio("Mode", settings_mod.MODES, key=key("mode"), horizontal=True)
    sb.number_input(
        "Current batch size (what you train with today)", min_value=1, key=key("current_batch")
    )
    sb.radio(
        "Search strategy",
        settings_mod.STRATEGIES,
        key=key("strategy"),
        horizontal=True,
        help="fast: trace two batches, predict, verify, bisect. linear: 8, 16, 24, ... "
        "until the first OOM (the prototype's protocol).",
    )
    with sb.expander("Advanced"):
        _advanced_inputs()


def _advanced_inputs() -> None:
    entry = _chosen_entry()
    if entry is not None:
        st.selectbox("Task", entry.tasks, key=key("task"))
    st.selectbox(
        "Loss",
        settings_mod.LOSSES,
        key=key("loss"),
        help="logits-mean is what inference-style tools measure",
    )
    st.selectbox("Attention", settings_mod.ATTENTIONS, key=key("attention"))
    st.selectbox(
        "Backend",
        settings_mod.BACKENDS,
        key=key("backend"),
        help="auto: this machine's GPU when it is the one chosen, else simulated",
    )
    st.number_input("Batch step", min_value=1, key=key("step"))
    st.number_input("Largest batch to try", min_value=1, key=key("max_batch"))
    st.text_input(
        "Safety margin below usable memory",
        key=key("margin"),
        help='A percentage ("2%") or a size ("512MiB"): headroom the answer keeps',
    )
    st.checkbox("Forward pass only (no_grad)", key=key("forward_only"))


def _slider(sb: Any, label: str, name: str, top: float, step: float, **kwargs: Any) -> None:
    value = float(st.session_state[key(name)])
    st.session_state[key(name)] = value
    sb.slider(label, 0.0, max(top, math.ceil(value)), step=step, key=key(name), **kwargs)


def _cost_inputs(sb: Any, gpu: GPU, show: bool) -> Costs:
    choice = st.session_state[key("gpu_choice")]
    if st.session_state.get(key("price_for")) != choice:
        st.session_state[key("price_for")] = choice
        st.session_state[key("usd_per_hour")] = gpu.usd_per_hour
    if show:
        sb.header("Cost calculator")
        top = float(max(10, math.ceil(2 * gpu.usd_per_hour)))
        _slider(
            sb,
            "Price per GPU-hour ($)",
            "usd_per_hour",
            top,
            0.01,
            help=f"Default: the catalog price of {gpu.name}, ${gpu.usd_per_hour:.2f}",
        )
        _slider(sb, "Hours per training run", "hours_per_run", HOURS_MAX, 0.5)
        _slider(sb, "Training runs per year", "runs_per_year", RUNS_MAX, 1.0)
    price = float(st.session_state[key("usd_per_hour")])
    return Costs(
        usd_per_hour=None if math.isclose(price, gpu.usd_per_hour) else price,
        hours_per_run=float(st.session_state[key("hours_per_run")]),
        runs_per_year=float(st.session_state[key("runs_per_year")]),
    )


def settings_sidebar(*, costs: bool = True) -> tuple[Settings | None, Costs]:
    """Draw the sidebar; return the chosen Settings (None if invalid, with st.error) and Costs."""
    _seed_from_url()
    _keep_alive()
    sb = st.sidebar
    for message in st.session_state.get(key("url_errors"), []):
        sb.warning(f"Ignored the link's settings: {message}. Defaults are shown instead.")
    sb.header("Settings")
    model_values = _model_inputs(sb)
    gpu_values, gpu = _gpu_inputs(sb)
    _training_inputs(sb)
    # Every field from its widget's state; one without a widget keeps what the link said.
    values = {n: st.session_state[key(n)] for n in SETTING_FIELDS if key(n) in st.session_state}
    values |= model_values | gpu_values
    chosen_costs = _cost_inputs(sb, gpu, costs)
    try:
        chosen = Settings(**values)
    except ValueError as exc:
        st.error(f"These settings cannot run: {exc}. Next step: change it in the sidebar.")
        return None, chosen_costs
    query = {**chosen.to_query(), **chosen_costs.to_query()}
    if st.query_params.to_dict() != query:
        st.query_params.from_dict(query)
    return chosen, chosen_costs
