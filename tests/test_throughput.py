"""Throughput: FLOP counts of known layers, the roofline per operator, and step timing."""

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode

from memorymark import gpus
from memorymark.accounting.throughput import (
    EFFICIENCY,
    Roofline,
    count_work,
    samples_per_second,
    time_step,
)

# Round rates, so every expected time is easy to check by hand.
RATES = Roofline(
    half_flops_per_s=4e12, fp32_flops_per_s=1e12, conv_fp32_flops_per_s=2e12, bytes_per_s=1e9
)


def test_a_linear_layer_forward_and_backward():
    layer = nn.Linear(64, 32)
    x = torch.zeros(8, 64, requires_grad=True)

    def step():
        layer(x).sum().backward()

    work = count_work(step, RATES)
    # Forward addmm 2*8*64*32; backward: grad input (8x32 @ 32x64) and grad weight
    # (32x8 @ 8x64), the same count each.
    assert work.flops == 3 * 2 * 8 * 64 * 32


def test_matmul_and_bmm():
    a, b = torch.zeros(16, 32), torch.zeros(32, 8)
    assert count_work(lambda: a @ b, RATES).flops == 2 * 16 * 32 * 8
    x, y = torch.zeros(4, 16, 32), torch.zeros(4, 32, 8)
    assert count_work(lambda: torch.bmm(x, y), RATES).flops == 2 * 4 * 16 * 32 * 8


def test_a_convolution_on_fake_tensors():
    # FLOP formulas read shapes only, so a fake (simulated) convolution counts the same.
    with FakeTensorMode():
        conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)
        images = torch.zeros(2, 3, 16, 16)
        work = count_work(lambda: conv(images), RATES)
    # 2 * batch * out channels * output pixels * (in channels * kernel area)
    assert work.flops == 2 * 2 * 4 * 16 * 16 * 3 * 3 * 3


def test_flops_kept_for_a_signature_are_those_of_its_own_shapes():
    # Each signature's FLOPs are kept for the next probe: a repeat counts the same, and
    # another shape or stride its own.
    a, b, c = torch.zeros(16, 32), torch.zeros(32, 8), torch.zeros(32, 4)
    assert count_work(lambda: (a @ b, a @ b, a @ c), RATES).flops == 2 * 16 * 32 * (8 + 8 + 4)
    with FakeTensorMode():
        conv = nn.Conv2d(3, 4, kernel_size=3, padding=1)
        strided = nn.Conv2d(3, 4, kernel_size=3, padding=1, stride=2)
        images = torch.zeros(2, 3, 16, 16)
        work = count_work(lambda: (conv(images), strided(images), conv(images)), RATES)
    assert work.flops == 2 * 2 * 4 * (16 * 16 + 8 * 8 + 16 * 16) * 3 * 3 * 3


def test_memory_bound_operators_cost_their_bytes_and_views_cost_nothing():
    x = torch.zeros(1024)  # 4096 bytes

    work = count_work(lambda: x + x, RATES)
    assert work.bytes_moved == 3 * 4096  # two inputs read, one output written
    assert work.roofline_seconds == pytest.approx(3 * 4096 / 1e9)
    assert count_work(lambda: x.view(32, 32).t(), RATES).bytes_moved == 0


def test_each_operator_takes_the_slower_of_compute_and_memory():
    a, b = torch.zeros(256, 256), torch.zeros(256, 256)
    flops, nbytes = 2 * 256**3, 3 * 256 * 256 * 4
    fp32 = count_work(lambda: a @ b, RATES)
    # fp32 matmul: plain FP32 rate (TF32 is off for matmuls by default).
    assert fp32.roofline_seconds == pytest.approx(max(flops / 1e12, nbytes / 1e9))
    half = count_work(lambda: a.bfloat16() @ b.bfloat16(), RATES)
    # The casts are memory-bound; the bf16 matmul runs at the tensor-core rate.
    casts = 2 * (256 * 256 * 6) / 1e9
    matmul = max(flops / 4e12, 3 * 256 * 256 * 2 / 1e9)
    assert half.roofline_seconds == pytest.approx(casts + matmul)
    assert half.step_seconds == pytest.approx((casts + matmul) / EFFICIENCY)


def test_rates_come_from_the_gpu_catalog():
    a100 = Roofline.for_gpu(gpus.find_gpu("A100 80GB"))
    assert (a100.half_flops_per_s, a100.fp32_flops_per_s) == (312e12, 19.5e12)
    assert a100.conv_fp32_flops_per_s == 156e12  # TF32 for cuDNN convolutions, Ampere on
    t4 = Roofline.for_gpu(gpus.find_gpu("T4"))
    assert t4.conv_fp32_flops_per_s == t4.fp32_flops_per_s == 8.1e12  # Turing: no TF32
    assert t4.half_flops_per_s == 65e12  # fp16 tensor cores (the T4 has no bf16)


def test_tf32_on_runs_fp32_matmuls_at_the_tf32_rate_where_the_gpu_has_it():
    # A script with torch.backends.cuda.matmul.allow_tf32 = True: the A100's fp32 matmuls run
    # at 156 TFLOP/s, ahead of the A10's 62.5; the T4 has no TF32 and keeps its FP32 rate.
    a100 = Roofline.for_gpu(gpus.find_gpu("A100 80GB"), tf32=True)
    a10 = Roofline.for_gpu(gpus.find_gpu("A10"), tf32=True)
    assert (a100.fp32_flops_per_s, a10.fp32_flops_per_s) == (156e12, 62.5e12)
    assert Roofline.for_gpu(gpus.find_gpu("T4"), tf32=True).fp32_flops_per_s == 8.1e12


def test_time_step_warms_up_synchronizes_and_takes_the_median():
    calls = []
    ticks = iter([0.0, 3.0, 10.0, 11.0, 20.0, 22.0])  # timed steps of 3, 1 and 2 seconds

    seconds = time_step(
        lambda: calls.append("step"),
        lambda: calls.append("sync"),
        steps=3,
        clock=lambda: next(ticks),
    )
    assert seconds == 2.0
    assert calls == ["step", "sync"] + ["step", "sync"] * 3
    with pytest.raises(ValueError, match="at least 1"):
        time_step(lambda: None, lambda: None, steps=0)


def test_samples_per_second():
    assert samples_per_second(32, 0.5) == 64.0
    assert samples_per_second(32, None) is None


def test_grouped_query_attention_counts_as_broadcast_where_torch_asserts_equal_heads():
    """PyTorch 2.11's attention formula asserts as many key/value heads as query heads (a real
    H100 run of Qwen2.5 failed on it); the count falls back to the heads broadcast, which is
    what 2.13's formula counts for grouped-query attention."""
    import functools

    from torch.utils.flop_counter import flop_registry

    from memorymark.accounting import throughput

    formula = flop_registry[torch.ops.aten._scaled_dot_product_flash_attention]

    def counts_equal_heads_only(q, k, v, *args, out_shape=None, **kwargs):
        assert q[1] == k[1] == v[1], "sdpa_flop_count: query/key/value shapes are incompatible"
        return formula.__wrapped__(q, k, v, *args, out_shape=out_shape, **kwargs)

    @functools.wraps(counts_equal_heads_only)
    def old_formula(*args, **kwargs):
        raise AssertionError("only the unwrapped formula is called")

    with FakeTensorMode():
        q = torch.empty(2, 14, 64, 64)
        kv = torch.empty(2, 2, 64, 64)
        expanded = torch.empty(2, 14, 64, 64)
    throughput._kept_flops.clear()
    gqa = throughput._flops(old_formula, (q, kv, kv, 0.0, True), {}, None)
    throughput._kept_flops.clear()
    full = throughput._flops(formula, (q, expanded, expanded, 0.0, True), {}, None)
    assert gqa == full == 2 * (2 * 2 * 14 * 64 * 64 * 64)
