"""The sidebar every page shares: training settings and the cost calculator, kept in the URL.

Owns the round trip between the widgets' session state (`mm_<field>`), `Settings`/`Costs` and
the query string (`?model=gpt2&gpu=T4`), so a shared link opens the same configuration on any
page; the GPU and cost widgets; and loading a whole `Settings` into the widgets (a link, or a fix
the user applies). The model and training widgets live in `model_inputs` and `training_inputs`.
Must not know how a sweep runs or how results are drawn.
"""

from __future__ import annotations

import math
from typing import Any

import streamlit as st

from memorymark import gpus
from memorymark.gpus import GPU
from memorymark.limits import one_line
from memorymark.measurement import memory_source
from memorymark.settings import Costs, Settings, check_model, parallel_checks
from memorymark.ui import distribution_inputs, model_inputs, sweep_runner, training_inputs
from memorymark.ui.literal import literal
from memorymark.ui.state_keys import SETTING_FIELDS, STATE_KEYS, key

LOCAL = "this machine"
CUSTOM = "custom"
DEFAULT_CUSTOM_GIB = 24.0
# Slider ends: a week of GPU time per run, and more than one run a day. A link may ask for more;
# the slider then stretches to hold it.
HOURS_MAX, RUNS_MAX = 168.0, 500.0
ANALYZE_NEXT_KEY = "mm_analyze_next"


def detected_gpu() -> GPU | None:
    """The CUDA GPU of the machine the sweeps run on (a worker's answer, asked once per server
    process), or None."""
    return sweep_runner.local_gpus().cuda_gpu


def _gpu_choice(s: Settings) -> str:
    if s.hardware.gpu_memory_gib is not None:
        return CUSTOM
    if s.hardware.gpu is None:
        return LOCAL if detected_gpu() else gpus.DEFAULT_SIMULATED_GPU
    return gpus.find_gpu(s.hardware.gpu).name


def load_settings(s: Settings) -> None:
    """Put every field of `s` into the sidebar's widgets (before they are drawn)."""
    values: dict[str, Any] = s.to_dict()
    values["task"] = s.workload.resolved_task
    spec = ":" in s.workload.model  # file:, hf:, timm:, torchvision: models go in the text box
    values["model"], values["model_spec"] = (
        (Settings().workload.model, s.workload.model) if spec else (s.workload.model, "")
    )
    values["gpu_memory_gib"] = s.hardware.gpu_memory_gib or DEFAULT_CUSTOM_GIB
    values["gpu_choice"] = _gpu_choice(s)
    for name, value in values.items():
        st.session_state[key(name)] = value
    st.session_state[model_inputs.TASK_FOR_KEY] = (
        s.workload.model
    )  # the task was chosen for this model


def apply_and_analyze(s: Settings) -> None:
    """Button callback: load `s` into the sidebar and ask the main page to analyze it."""
    load_settings(s)
    st.session_state[ANALYZE_NEXT_KEY] = True


def analysis_pending() -> bool:
    """True while an `apply_and_analyze` waits for the main page (not consumed)."""
    return bool(st.session_state.get(ANALYZE_NEXT_KEY))


def analysis_requested() -> bool:
    """True once after `apply_and_analyze`: the main page starts the sweep by itself."""
    return bool(st.session_state.pop(ANALYZE_NEXT_KEY, False))


def _seed_from_url() -> None:
    """Fill the widgets' state from the query string, once per browser session."""
    if st.session_state.get(key("seeded")):
        return
    st.session_state[key("seeded")] = True
    params, errors = st.query_params.to_dict(), []
    try:
        s = Settings.from_query(params)
        check_model(s)
        _gpu_choice(s)
    except ValueError as exc:
        errors.append(str(exc))
        s = Settings()
    try:
        c = Costs.from_query(params)
    except ValueError as exc:
        errors.append(str(exc))
        c = Costs()
    load_settings(s)
    for name, value in c.to_dict().items():
        st.session_state[key(name)] = value
    choice = st.session_state[key("gpu_choice")]
    st.session_state[key("price_for")] = choice if c.usd_per_hour is not None else None
    st.session_state[key("url_errors")] = errors


def _keep_alive() -> None:
    # Streamlit forgets a widget's value on a page that does not draw it; re-assigning the
    # value at the top of every page keeps the choice when the user switches pages.
    for name in STATE_KEYS:
        if key(name) in st.session_state:
            st.session_state[key(name)] = st.session_state[key(name)]


def keep_settings() -> None:
    """On a page without the settings sidebar: keep the user's choices for the pages with it."""
    _keep_alive()


def _gpu_label(choice: str) -> str:
    local = detected_gpu()
    if choice == LOCAL and local is not None:
        return f"{local.name}: this machine (measured)"
    if choice == CUSTOM:
        return "Custom memory size (simulated)"
    gpu = gpus.find_gpu(choice)
    how = memory_source(local is not None and local.name == gpu.name)
    return f"{gpu.name}, {gpu.total_gib:.0f} GiB ({how})"


def _selected_gpu(choice: str, custom_gib: float) -> GPU:
    local = detected_gpu()
    if choice == LOCAL and local is not None:
        return local
    if choice == CUSTOM:
        return gpus.custom_gpu(custom_gib)
    return gpus.find_gpu(choice)


def _gpu_inputs(sb: Any) -> tuple[dict[str, Any], GPU]:
    local = detected_gpu()
    options = ([LOCAL] if local else []) + gpus.gpu_names() + [CUSTOM]
    if st.session_state.get(key("gpu_choice")) not in options:
        st.session_state[key("gpu_choice")] = LOCAL if local else gpus.DEFAULT_SIMULATED_GPU
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
            f"(default: {gpus.DEFAULT_SIMULATED_GPU})."
        )
    values = {
        "gpu": None if choice in (LOCAL, CUSTOM) else choice,
        "gpu_memory_gib": float(custom_gib) if choice == CUSTOM else None,
    }
    return values, _selected_gpu(choice, custom_gib)


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


def gpu_refusal(s: Settings, gpu: GPU) -> str | None:
    """Why `gpu` cannot train `s`, in the sidebar's words, or None. The rule is the engine's own
    (`GPU.check_precision`, `check_attention`, which a sweep would fail on in its worker); its
    message names CLI flags, so the words here name the widgets instead."""
    try:
        gpu.check_precision(s.workload.precision)
    except ValueError:
        major, minor = gpu.compute_capability
        return (
            f"the {gpu.name} has no bf16 (compute capability {major}.{minor}; bf16 needs 8.0 or "
            "newer). Set **Precision** to 16-mixed (fp16 autocast with a gradient scaler) or "
            "32-true, or pick a **GPU** with bf16 (an A10, L4, A100 or newer)"
        )
    try:
        gpu.check_attention(s.workload.attention)
    except ValueError:
        return (
            f"FlashAttention-2 needs an Ampere or newer GPU and the {gpu.name} is older. Set "
            "**Attention** to sdpa, or pick a newer **GPU**"
        )
    return None


def settings_sidebar(
    *, costs: bool = True, check_gpu: bool = False
) -> tuple[Settings | None, Costs]:
    """Draw the sidebar; return the chosen Settings (None if invalid, with st.error) and Costs.
    `check_gpu`: also refuse settings the chosen GPU cannot train (bf16 on a T4), for a page
    that runs on that GPU (not one that compares the catalog)."""
    _seed_from_url()
    _keep_alive()
    sb = st.sidebar
    for message in st.session_state.get(key("url_errors"), []):
        shown = literal(message)
        sb.warning(f"Ignored the link's settings: {shown}. Defaults are shown instead.")
    sb.header("Settings")
    model_values, entry = model_inputs.model_inputs(sb)
    gpu_values, gpu = _gpu_inputs(sb)
    gpu_values |= distribution_inputs.distribution_inputs(sb)
    training_values = training_inputs.training_inputs(sb, entry)
    # Every field from its widget's state; one without a widget keeps what the link said.
    values = {n: st.session_state[key(n)] for n in SETTING_FIELDS if key(n) in st.session_state}
    values |= model_values | gpu_values | training_values
    chosen_costs = _cost_inputs(sb, gpu, costs)
    try:
        chosen = Settings(**values)
        # A `file:` or `hf:` model is read here, not in Settings; then what its shape allows
        # of the tensor and context parallel degrees.
        parallel_checks.check_parallel(chosen, check_model(chosen))
    except ValueError as exc:
        message = literal(one_line(exc))
        st.error(f"These settings cannot run: {message}. Next step: change it in the sidebar.")
        return None, chosen_costs
    refusal = gpu_refusal(chosen, gpu) if check_gpu else None
    if refusal is not None:
        st.error(f"These settings cannot run here: {refusal}.")
        return None, chosen_costs
    query = {**chosen.to_query(), **chosen_costs.to_query()}
    if st.query_params.to_dict() != query:
        st.query_params.from_dict(query)
    return chosen, chosen_costs
