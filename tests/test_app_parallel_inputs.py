"""The sidebar's tensor and context parallel inputs: shown beside FSDP, carried into the link
and the settings, reset to 1 when the strategy cannot take them."""

from __future__ import annotations

from app_helpers import app


def test_tp_and_cp_inputs_reach_the_link_beside_fsdp_and_reset_without_it() -> None:
    at = app(model="tiny-llama", seq_len="256", dist="fsdp", gpus="8")
    assert not at.exception
    at.number_input(key="mm_tp").set_value(2).run()
    at.number_input(key="mm_cp").set_value(2).run()
    assert not at.exception and not at.error
    assert (at.query_params["tp"], at.query_params["cp"]) == ("2", "2")
    at.selectbox(key="mm_dist").set_value("ddp").run()
    assert not [w for w in at.number_input if w.key in ("mm_tp", "mm_cp")]
    assert "tp" not in at.query_params and not at.error


def test_a_tp_the_heads_do_not_divide_is_refused_in_the_sidebar() -> None:
    at = app(model="tiny-llama", seq_len="256", dist="fsdp", gpus="6")
    at.number_input(key="mm_tp").set_value(3).run()
    assert "does not divide" in at.error[0].value
