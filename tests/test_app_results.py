"""The main page's newer pieces under AppTest: throughput, which memory number is which, the
training-script snippets, the fixes when nothing fits, and every setting in the sidebar."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from app_helpers import A10, app, chart, metrics, run_until, shown, trace

from memorymark import gpus, models
from memorymark.measurement import DepthReplay
from memorymark.models import sources
from memorymark.settings import Settings
from memorymark.ui.state_keys import SETTING_FIELDS
from memorymark.units import GIB, gib
from memorymark.ways_out import Fix

pytestmark = pytest.mark.usefixtures("fresh_caches")


def analyzed(**query: str):  # an AppTest after one click on Analyze
    at = app(**query)
    at.button(key="analyze").click().run()
    assert not at.exception
    return at


def widget_keys(at, kind: str) -> set[str]:
    return {w.key for w in at.get(kind)}


def test_throughput_chart_and_where_larger_batches_stop_paying_off(fake) -> None:
    fake.batches = (8, 16, 64, 192, 200)
    fake.rate = staticmethod(lambda batch: 10.0 * min(batch, 64))  # flat from batch 64 on
    at = analyzed(model="tiny-bert")
    spec = chart(at, "throughput_chart")
    line = trace(spec, "samples/s (estimated)")
    assert (line["x"], line["y"]) == ([8, 16, 64, 192], [80, 160, 640, 640])
    assert trace(spec, "current (batch 16)")["y"] == [160]
    assert trace(spec, "optimal (batch 192)")["y"] == [640]
    assert "estimated from FLOPs and bytes" in spec["layout"]["title"]["text"]
    notes = [a["text"] for a in spec["layout"]["annotations"]]
    assert "stops paying off at batch 64" in notes and "out of memory" in notes
    assert spec["layout"]["xaxis"]["range"] == chart(at, "sweep_chart")["layout"]["xaxis"]["range"]
    assert metrics(at)["Speedup (estimated throughput)"] == "4.00x"  # 640 / 160
    caption = next(c.value for c in at.main.caption if c.value.startswith("Throughput"))
    assert "Larger batches stop paying off at batch 64" in caption and "coarse" in caption


def test_no_knee_line_while_throughput_still_grows_at_the_optimal_batch(fake) -> None:
    at = analyzed(model="tiny-bert")
    notes = [a["text"] for a in chart(at, "throughput_chart")["layout"].get("annotations", [])]
    assert not any("stops paying off" in n for n in notes)
    assert any("still growing at the optimal batch" in c.value for c in at.main.caption)


def test_without_a_throughput_the_speedup_is_the_batch_ratio(fake) -> None:
    fake.rate = staticmethod(lambda batch: 0.0)
    shown = metrics(analyzed(model="tiny-bert"))
    assert shown["Speedup (batch ratio: throughput not known)"] == "12.0x"


def test_which_memory_number_is_which(fake) -> None:
    at = analyzed(model="tiny-bert")
    assert at.expander[0].label == "Which memory number is which (simulated)"
    table = at.dataframe[0].value.set_index("Figure")
    reserved = 20 * GIB + GIB // 5 + 64 * 2**20
    assert table.loc["Allocated at batch 192", "Value"] == "20.20 GiB"
    assert table.loc["Reserved at batch 192", "Value"] == f"{gib(reserved):.2f} GiB"
    assert table.loc["Usable capacity", "Value"] == f"{gib(A10.usable_bytes):.2f} GiB"
    margin = A10.usable_bytes * 2 // 100
    assert table.loc["Margin", "Value"] == f"{gib(margin):.2f} GiB"
    assert table.loc["Limit", "Value"] == f"{gib(A10.usable_bytes - margin):.2f} GiB"
    assert (
        table.loc["Headroom at batch 192", "Value"] == f"{gib(A10.usable_bytes - reserved):.2f} GiB"
    )
    assert table.loc["First batch out of memory", "Value"] == "batch 200"
    assert set(table.loc[["Allocated at batch 192", "Reserved at batch 192"], "Source"]) == {
        "simulated"
    }


def test_the_results_say_how_the_depth_was_had_and_a_replan_keeps_it(fake) -> None:
    def caption(at) -> str:
        return next(c.value for c in at.main.caption if " probes in " in c.value)

    said = "80 blocks replayed from simulated traces at 2, 3, 4 and 5 blocks (14 steps traced, 6 "
    assert said not in caption(analyzed(model="tiny-bert"))  # the backend said nothing
    fake.depth_replay = DepthReplay(80, (2, 3, 4, 5), 14, 6)
    at = analyzed(model="tiny-bert", seq_len="64")
    assert f"{said}replayed)." in caption(at)
    fake.depth_replay = None  # a re-plan's session did not sweep: the cached sweep says it
    at.number_input(key="mm_target_batch").set_value(512).run()
    assert len(fake.created) == 2 and "re-planned from the cached sweep" in at.code[0].value
    assert f"{said}replayed)." in caption(at)


def test_snippets_and_the_plan_for_a_target_batch(fake) -> None:
    at = analyzed(model="tiny-bert", target_batch="512", precision="bf16-mixed")
    assert [t.label for t in at.tabs] == ["Hugging Face", "Lightning", "PyTorch"]
    plan = next(m.value for m in at.markdown if m.value.startswith("For a global batch"))
    # The largest divisor of 512 that fits (192 does alone): exactly 128 x 4, not 171 x 3 = 513.
    assert "micro-batch 128 x 4 accumulation steps = 512 samples" in plan
    hf, lightning, torch_loop = (c.value for c in at.code[1:4])
    assert "per_device_train_batch_size=128," in hf and "gradient_accumulation_steps=4," in hf
    assert "bf16=True," in hf
    assert 'precision="bf16-mixed"' in lightning and "accumulate_grad_batches=4" in lightning
    assert "batch_size=128" in torch_loop and "accumulation_steps = 4" in torch_loop


def fixes_for(settings: Settings) -> tuple[Fix, ...]:
    limit = A10.usable_bytes - settings.margin_bytes(A10.usable_bytes)
    h100 = gpus.find_gpu("H100")
    return (
        Fix(label="gradient checkpointing", settings=settings.replace(grad_checkpointing=True),
            gpu=A10, peak_bytes=2 * GIB, required_bytes=2 * GIB, limit_bytes=limit),
        Fix(label="LoRA rank 16", settings=settings.replace(lora_rank=16), gpu=A10,
            peak_bytes=43 * GIB, required_bytes=43 * GIB, limit_bytes=limit),
        Fix(label="a bigger GPU: H100 80GB", settings=settings.replace(gpu=h100.name), gpu=h100,
            peak_bytes=31 * GIB, required_bytes=31 * GIB,
            limit_bytes=h100.usable_bytes),
    )  # fmt: skip


def test_nothing_fits_shows_how_far_off_each_fix_is_and_applies_one(fake) -> None:
    fake.base_bytes = 30 * GIB  # batch 1 needs more than the A10 has
    fake.fixes = staticmethod(fixes_for)
    at = analyzed(model="tiny-bert")
    assert at.error[0].value.startswith("No batch size trains on this A10")
    assert "Next step: one of the changes below" in at.error[0].value
    limit = gib(A10.usable_bytes * 98 // 100)
    lines = [m.value for m in at.markdown]
    assert f"batch 1 peaks at 31.00 GiB of {limit:.2f} GiB: 1.5x the limit" in lines[0]
    assert any("**gradient checkpointing** on A10" in s and "fits" in s for s in lines)
    assert any("**LoRA rank 16**" in s and "2.0x the limit" in s for s in lines)
    assert "still too big" in next(s for s in lines if "LoRA" in s)
    at.button(key="apply_fix_0").click().run()
    assert not at.exception
    assert at.selectbox(key="mm_checkpointing").value == "full"
    assert at.query_params["checkpointing"] == "full"
    assert fake.created[-1].workload.grad_checkpointing and len(fake.created) == 2
    assert metrics(at)["Optimal batch size"] == "192"  # checkpointing made it fit


def test_each_way_out_shows_with_its_button_as_it_is_found(fake) -> None:
    fake.base_bytes = 30 * GIB  # batch 1 needs more than the A10 has
    fake.fixes, fake.fixes_gate = staticmethod(fixes_for), threading.Event()
    at = app(sync=False, model="tiny-bert")
    at.button(key="analyze").click().run()
    try:
        run_until(at, lambda at: any(b.key == "apply_live_fix_0" for b in at.button))
        # The first way out, with its button, while the others are still searched.
        assert "1 way out found so far" in at.get("progress")[0].proto.text
        assert not any(b.key == "apply_live_fix_1" for b in at.button)
        left = next(c.value for c in at.caption if "still looking at" in c.value)
        assert "LoRA rank 16, a bigger GPU: H100 80GB" in shown(left)
        line = next(m.value for m in at.markdown if "**gradient checkpointing**" in m.value)
        assert "fits" in line
        # Applied at once: the search stops and checkpointing is analyzed.
        at.button(key="apply_live_fix_0").click().run()
    finally:
        fake.fixes_gate.set()
    run_until(at, lambda at: bool(at.metric))
    assert not at.exception
    assert at.selectbox(key="mm_checkpointing").value == "full"
    assert fake.created[-1].workload.grad_checkpointing and len(fake.created) == 2
    assert metrics(at)["Optimal batch size"] == "192"


def test_a_search_stopped_at_its_limit_shows_those_found_and_names_the_rest(fake) -> None:
    fake.base_bytes = 30 * GIB
    fake.fixes = staticmethod(lambda s: fixes_for(s)[:1])
    left = ("LoRA rank 16", "a bigger GPU", "several GPUs (FSDP)")
    fake.fixes_stop = ("the time limit (300 s), in the middle of a step", left)
    at = analyzed(model="tiny-bert")
    assert "Next step: one of the changes below" in at.error[0].value
    note = shown(at.warning[0].value)
    assert note.startswith("The sweep finished (no batch fits); the search for ways out then")
    assert "Not finished: LoRA rank 16, a bigger GPU, several GPUs (FSDP)." in note
    assert at.button(key="apply_fix_0").label == "Apply and analyze"
    log = at.code[0].value
    assert "done: no batch fits" in log and "ways out: 1 way out, the search stopped at" in log
    page = [e.value for kind in ("warning", "error", "caption", "markdown") for e in at.get(kind)]
    assert not any("middle of a probe" in text or "Partial answer" in text for text in page)


def test_settings_appear_only_when_they_apply() -> None:
    at = app(model="tiny-gpt2", seq_len="64", attention="eager")
    numbers, selects = widget_keys(at, "number_input"), widget_keys(at, "selectbox")
    assert "mm_seq_len" in numbers and "mm_image_size" not in numbers
    assert {"mm_task", "mm_attention"} <= selects  # GPT-2 trains causal-lm or classification
    at.selectbox(key="mm_model").set_value("tiny-resnet").run()
    numbers, selects = widget_keys(at, "number_input"), widget_keys(at, "selectbox")
    assert "mm_image_size" in numbers and "mm_seq_len" not in numbers
    assert not {"mm_task", "mm_attention"} & selects
    assert "seq_len" not in at.query_params and "attention" not in at.query_params
    at.selectbox(key="mm_model").set_value("tiny-gpt2").run()
    assert at.number_input(key="mm_seq_len").value == 64  # kept for when it applies again
    at.text_input(key="mm_model_spec").set_value("torchvision:resnet18").run()
    assert "mm_checkpointing" not in widget_keys(at, "selectbox")  # no switch there


def test_the_checkpointing_mode_is_chosen_and_an_old_link_still_turns_it_on() -> None:
    at = app(model="tiny-gpt2", grad_checkpointing="true")  # a link from before the modes
    assert not at.exception and not at.error
    assert at.selectbox(key="mm_checkpointing").value == "full"
    assert (
        at.query_params["checkpointing"] == "full" and "grad_checkpointing" not in at.query_params
    )
    assert at.selectbox(key="mm_checkpointing").options[:4] == [
        "none", "full", "selective-op", "layers:2"
    ]  # fmt: skip
    at.selectbox(key="mm_checkpointing").set_value("selective-op").run()
    assert at.query_params["checkpointing"] == "selective-op"
    at.selectbox(key="mm_checkpointing").set_value("none").run()
    assert "checkpointing" not in at.query_params


def test_every_setting_round_trips_through_the_link() -> None:
    link = {
        "model": "tiny-gpt2", "task": "sequence-classification", "seq_len": "64",
        "optimizer": "adafactor", "mode": "eval", "loss": "logits-mean",
        "precision": "bf16-true", "attention": "eager", "checkpointing": "layers:3",
        "lora_rank": "8", "lora_targets": "c_attn", "forward_only": "true", "gpu": "L4",
        "backend": "sim", "strategy": "linear", "step": "4", "current_batch": "8",
        "max_batch": "256", "target_batch": "64", "margin": "5%", "depth": "trace",
    }  # fmt: skip
    at = app(**link)  # bf16 needs a GPU with bf16: an L4, not a T4 (tests/test_app_gpu_choice.py)
    assert not at.exception and not at.error
    assert dict(at.query_params) == link
    assert at.selectbox(key="mm_checkpointing").value == "layers:3"  # listed, though not common
    assert at.number_input(key="mm_lora_rank").value == 8
    assert at.text_input(key="mm_lora_targets").value == "c_attn"
    assert at.number_input(key="mm_target_batch").value == 64
    assert at.selectbox(key="mm_precision").value == "bf16-true"
    assert at.radio(key="mm_depth").value == "trace"
    at.number_input(key="mm_lora_rank").set_value(0).run()
    assert "lora_rank" not in at.query_params and "lora_targets" not in at.query_params
    at.number_input(key="mm_target_batch").set_value(None).run()
    assert "target_batch" not in at.query_params


def test_the_protocol_shortcut_sets_mode_loss_and_optimizer() -> None:
    at = app(model="tiny-bert")
    at.radio(key="mm_protocol").set_value("inference-style").run()
    assert {k: at.query_params[k] for k in ("mode", "loss", "optimizer")} == {
        "mode": "eval", "loss": "logits-mean", "optimizer": "none"}  # fmt: skip
    assert at.radio(key="mm_protocol").value == "inference-style"
    at.radio(key="mm_protocol").set_value("full").run()
    assert not {"mode", "loss", "optimizer"} & set(dict(at.query_params))


def test_a_bad_value_is_an_error_with_a_next_step_never_a_traceback() -> None:
    at = app(model="tiny-bert")
    at.text_input(key="mm_margin").set_value("lots").run()
    assert not at.exception
    assert "These settings cannot run: margin must be a percentage" in shown(at.error[0].value)
    assert "Next step" in at.error[0].value


def test_an_uploaded_config_becomes_an_upload_model(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setattr(sources, "UPLOAD_DIR", tmp_path)
    monkeypatch.setattr(sources, "_config_root", tmp_path.resolve())
    sources.from_upload.cache_clear()
    data = Path(models.CONFIG_DIR, "tiny-bert.json").read_bytes()
    at = app()
    at.file_uploader(key="mm_upload").set_value(("my bert.json", data, "application/json")).run()
    assert not at.exception
    spec = at.text_input(key="mm_model_spec").value
    assert spec.startswith("upload:my-bert-") and "/" not in spec  # a name, never a path
    assert (tmp_path / spec.removeprefix("upload:") / "config.json").read_bytes() == data
    assert at.query_params["model"] == spec
    assert any("shared link opens it only here" in c.value for c in at.sidebar.caption)
    at.file_uploader(key="mm_upload").clear().run()
    assert at.text_input(key="mm_model_spec").value == ""


def test_every_setting_has_a_widget_where_it_applies() -> None:
    def keys(at) -> set[str]:
        kinds = ("selectbox", "text_input", "number_input", "checkbox", "radio")
        return {w.key for kind in kinds for w in at.get(kind)}

    text = keys(app(model="tiny-gpt2", gpu_memory_gib="24", lora_rank="8", quantization="nf4"))
    image = keys(app(model="tiny-resnet"))
    many = keys(app(model="tiny-gpt2", dist="fsdp", gpus="2"))  # GPU count, nodes, offload...
    pipeline = keys(app(model="tiny-llama", dist="fsdp", gpus="4", pp="2",
                        pp_schedule="interleaved-1f1b", virtual_stages="2"))  # fmt: skip
    drawn = {k.removeprefix("mm_") for k in text | image | many | pipeline} | {"gpu"}
    assert "mm_gpu_choice" in text
    assert set(SETTING_FIELDS) <= drawn


def test_qlora_with_a_paged_optimizer_shows_the_weights_and_the_paging_rule() -> None:
    at = analyzed(
        model="tiny-gpt2",
        lora_rank="4",
        quantization="nf4",
        double_quant="true",
        optimizer="paged_adamw_8bit",
        max_batch="16",
    )
    captions = [c.value for c in at.main.caption]
    weights = next(c for c in captions if c.startswith("Quantized base weights"))
    assert "simulated" in weights and "GiB" in weights
    # LoRA rank 4 on a tiny GPT-2: every state buffer is under the paging threshold.
    assert any(c.startswith("No optimizer state is paged: bitsandbytes") for c in captions)
    assert not any("0.00 GiB" in c for c in captions)


def test_an_eval_pass_shows_its_answer_and_its_inputs_round_trip() -> None:
    at = analyzed(
        model="tiny-gpt2", seq_len="64", gpu_memory_gib="1", max_batch="64", eval_batch="256"
    )
    assert at.number_input(key="mm_eval_batch").value == 256
    assert at.number_input(key="mm_eval_accumulation").value is None  # unset: one batch
    info = next(i.value for i in at.main.info if i.value.startswith("Evaluation at eval batch"))
    assert "256 (1 batch of predictions kept, peak" in info
    assert "fits beside training batch" in info and "simulated" in info
    assert any("eval_accumulation_steps unset" in c.value for c in at.main.caption)
    at.number_input(key="mm_eval_batch").set_value(None).run()
    assert not at.exception
    assert at.number_input(key="mm_eval_accumulation").disabled


def test_the_eval_accumulation_box_says_what_runs_when_left_empty() -> None:
    # Reported: "unset: one batch measured", cut by the sidebar, read as Trainer's unset.
    at = app(model="tiny-bert", eval_batch="8")
    box = at.number_input(key="mm_eval_accumulation")
    assert box.value is None and box.proto.placeholder == "1 (one batch)"


def test_a_compiled_step_shows_the_eager_step_beside_it() -> None:
    at = analyzed(model="tiny-gpt2", seq_len="64", max_batch="64", compile="true")
    info = next(i.value for i in at.main.info if i.value.startswith("Compiled, the largest"))
    assert "eager, the largest batch that fits is" in info and "saved activations" in info
