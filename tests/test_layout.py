"""The parallel layout's arithmetic (memorymark/distributed/layout.py) and its one-line refusals."""

import pytest

from memorymark.distributed.layout import Layout, check_model
from memorymark.settings import Settings

pytestmark = pytest.mark.fast


def test_the_mesh_is_torchtitans_order_with_data_parallel_what_is_left():
    layout = Settings(dist="fsdp", gpus="512", tp=8, pp=8).hardware.layout()
    assert (layout.dp_shard, layout.dp_replicate) == (8, 1)
    assert layout.mesh() == ((8, 8, 8), ("pp", "dp_shard", "tp"))
    assert layout.describe() == "FSDP 8 x TP 8 x PP 8"
    ddp = Layout(gpus=16, dist="ddp", tp=4)
    assert ddp.mesh() == ((4, 4), ("dp_replicate", "tp"))
    assert Layout(gpus=8, tp=8).describe() == "TP 8"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(dist="fsdp", gpus="8", tp=3), "does not divide 8 GPUs"),
        (dict(gpus="16", tp=8), "needs a distributed strategy"),
        (dict(dist="fsdp", gpus="32", tp=16), "inside one 8-GPU node"),
        (dict(dist="hsdp", gpus="16", tp=2), "hsdp beside"),
        (dict(dist="fsdp", gpus="4", pp=2, virtual_stages=2), "is for --pp-schedule"),
        (dict(dist="fsdp", gpus="4", pp=2, pp_schedule="interleaved-1f1b"), "--virtual-stages"),
        (dict(pp_schedule="zb"), "pp_schedule must be one of"),
        (dict(tp=0), "tp must be"),
    ],
)
def test_an_impossible_layout_is_refused_in_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message) as caught:
        Settings(**kwargs)
    assert "\n" not in str(caught.value)


def test_the_models_shape_bounds_the_degrees():
    check_model(Layout(gpus=8, tp=8), heads=32, kv_heads=8, layers=32, seq_len=8192)
    with pytest.raises(ValueError, match="does not divide the model's 6 key/value heads"):
        check_model(Layout(gpus=4, tp=4), heads=24, kv_heads=6, layers=32, seq_len=None)
    with pytest.raises(ValueError, match="leave 2 data-parallel ranks"):
        Layout(gpus=16, tp=8)
    with pytest.raises(ValueError, match="each stage needs a layer"):
        check_model(Layout(gpus=8, pp=8), heads=None, kv_heads=None, layers=4, seq_len=None)
    with pytest.raises(ValueError, match="divisible by 8"):
        check_model(Layout(gpus=4, cp=4), heads=None, kv_heads=None, layers=None, seq_len=100)


def test_the_engine_refuses_a_layout_it_does_not_simulate_yet():
    from memorymark.engine import Session

    with pytest.raises(ValueError, match="--pp beside --cp is not simulated yet"):
        Session(Settings(model="tiny-llama", dist="fsdp", gpus="8", pp=2, cp=2, backend="sim"))
