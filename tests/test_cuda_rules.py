"""Each CUDA rule against the behaviour PyTorch documents for it, on small shapes (issue 4)."""

import threading

import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from memorymark import cuda_rules, gpus
from memorymark.accounting.tracker import MemoryTracker
from memorymark.backends.resolve import resolve
from memorymark.backends.sim import SimBackend
from memorymark.cuda_rules import autocast_emulation, autocast_lists, versions
from memorymark.cuda_rules.dropout import fused_dropout
from memorymark.cuda_rules.sdpa_choice import CUDNN, EFFICIENT, FLASH, MATH, SdpaCall
from memorymark.cuda_rules.sdpa_choice import select_backend as choose
from memorymark.engine import Session
from memorymark.fit import FitPolicy
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

BIG = 1024 * 2**30
T4, V100, A10, A100, H100 = (7, 5), (7, 0), (8, 6), (8, 0), (9, 0)


def call(dtype=torch.float32, *, head_dim=64, q_len=128, k_len=None, mask=False, dropout=0.1,
         causal=False, grad=True, offset=0):  # fmt: skip
    """An SDPA call on (2, 4, L, head_dim) meta tensors, laid out as transformers lays them out."""
    k_len = k_len or q_len

    def qkv(length):
        base = torch.empty(2, length, 4, head_dim + offset, dtype=dtype, device="meta")
        return base[..., offset:].transpose(1, 2).requires_grad_(grad)

    attn_mask = torch.ones(2, 1, q_len, k_len, dtype=torch.bool, device="meta") if mask else None
    return SdpaCall.from_tensors(qkv(q_len), qkv(k_len), qkv(k_len), attn_mask, dropout, causal)


@pytest.mark.parametrize(
    ("sdpa_call", "capability", "backend"),
    [
        (call(torch.float32), A10, EFFICIENT),  # flash takes fp16/bf16 only
        (call(torch.bfloat16), A10, FLASH),
        (call(torch.float16), A100, FLASH),
        (call(torch.float16), T4, EFFICIENT),  # flash needs sm80
        (call(torch.bfloat16), T4, MATH),  # mem-efficient below sm80: fp16 and fp32 only
        (call(torch.float32), V100, EFFICIENT),
        (call(torch.bfloat16, mask=True), A100, EFFICIENT),  # flash takes no arbitrary mask
        (call(torch.bfloat16, causal=True), A100, FLASH),  # is_causal is no mask
        (call(torch.bfloat16, causal=True, q_len=64, k_len=128), A100, EFFICIENT),
        (call(torch.bfloat16, head_dim=264), A100, EFFICIENT),  # flash: head dim <= 256
        (call(torch.bfloat16, head_dim=72), A100, FLASH),  # padded to 80 by the composite
        (call(torch.bfloat16, head_dim=256), A100, FLASH),
        (call(torch.bfloat16, head_dim=256), A10, EFFICIENT),  # no flash backward > 192 on sm86
        (call(torch.bfloat16, head_dim=256, grad=False), A10, FLASH),
        (call(torch.float32, head_dim=6), A100, MATH),  # mem-efficient: multiple of 4 for fp32
        (call(torch.float32, head_dim=6), V100, EFFICIENT),  # no alignment without tensor cores
        (call(torch.float32, offset=2), A100, MATH),  # storage offset not 16-byte aligned
        (call(torch.bfloat16, dropout=0.0), H100, CUDNN),  # cuDNN first on sm90
        (call(torch.bfloat16, dropout=0.1), H100, FLASH),  # cuDNN dropout: multiples of 1/16
        (call(torch.bfloat16, dropout=0.125), H100, CUDNN),
        (call(torch.float32), H100, EFFICIENT),
    ],
)
def test_sdpa_backend_is_chosen_as_sdp_utils_does(sdpa_call, capability, backend):
    assert choose(sdpa_call, capability) == backend


def _live_bytes_after(fn, *shapes, dtype=torch.float32, rules=True, capability=A10):
    """Bytes alive after `fn` on fresh fake inputs: what autograd keeps, plus the output."""
    with FakeTensorMode():
        inputs = [torch.empty(s, dtype=dtype, requires_grad=True) for s in shapes]
        scope = cuda_rules.applied(capability) if rules else torch.enable_grad()
        with scope, MemoryTracker() as tracker:
            out = fn(*inputs)
        return tracker.live_bytes, out


def _sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, dropout_p=0.1)


@pytest.mark.parametrize(
    ("dtype", "kernel"),
    [(torch.float32, "EfficientAttention"), (torch.bfloat16, "FlashAttention")],
)
def test_fused_attention_saves_its_output_and_logsumexp_not_the_attention_matrix(dtype, kernel):
    shape = (1, 2, 256, 64)  # on an A10: mem-efficient for fp32, flash for bf16
    live, out = _live_bytes_after(_sdpa, shape, shape, shape, dtype=dtype)
    output_bytes, lse_bytes = 1 * 2 * 256 * 64 * dtype.itemsize, 1 * 2 * 256 * 4
    assert kernel in out.grad_fn.name()
    assert output_bytes + lse_bytes <= live <= output_bytes + lse_bytes + 64  # + rng seed/offset
    cpu_live, _ = _live_bytes_after(_sdpa, shape, shape, shape, dtype=dtype, rules=False)
    attention_matrix = 1 * 2 * 256 * 256 * dtype.itemsize
    assert cpu_live > 2 * attention_matrix  # CPU's math path keeps it, and its dropout mask


def test_math_attention_on_cuda_keeps_fp32_scores_and_a_bool_dropout_mask():
    shape = (1, 2, 256, 64)  # bf16 on a T4: neither fused kernel takes it
    live, out = _live_bytes_after(_sdpa, shape, shape, shape, dtype=torch.bfloat16, capability=T4)
    scores = 1 * 2 * 256 * 256
    # Upcast to fp32 for accuracy, as _scaled_dot_product_attention_math does: the scaled q and k
    # and the fp32 v, the softmax output, the dropped-out scores (fp32) and their mask (bool, the
    # dropout rule) stay for backward; the output comes back in bf16.
    assert out.dtype == torch.bfloat16
    qkv_fp32, out_bytes = 3 * 2 * 256 * 64 * 4, 2 * 256 * 64 * 2
    assert live == qkv_fp32 + scores * (4 + 4 + 1) + out_bytes


def test_real_size_bert_peaks_far_lower_under_cuda_rules():
    settings = Settings(model="bert", seq_len=512, gpu="a10")
    cpu = SimBackend(
        CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG), cuda_rules=False
    ).measure(4)
    cuda = SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(4)
    # Each layer's 12 x 512 x 512 fp32 attention matrix and its mask are gone; BERT-base's
    # weights and AdamW state (~1.3 GB) stay.
    assert cuda.peak_bytes < 0.6 * cpu.peak_bytes
    assert cuda.breakdown.activations < 0.45 * cpu.breakdown.activations


def test_dropout_mask_is_one_byte_per_element():
    n = 1000
    drop = lambda x: F.dropout(x, 0.1, training=True)  # noqa: E731
    live, out = _live_bytes_after(drop, (n,))
    assert live == 4 * n + n  # fp32 output + bool mask
    assert out.grad_fn.name() == "NativeDropoutBackward0"
    cpu_live, _ = _live_bytes_after(drop, (n,), rules=False)
    assert cpu_live == 4 * n + 4 * n  # CPU: the noise tensor in the input dtype


def test_dropout_rule_holds_on_real_tensors_and_leaves_other_cases_alone():
    x = torch.randn(8, 8, requires_grad=True)
    assert fused_dropout(F.dropout, x, 0.5).grad_fn.name() == "NativeDropoutBackward0"
    assert fused_dropout(F.dropout, x, 0.5, training=False) is x
    inplace = fused_dropout(F.dropout, x.clone(), 0.5, inplace=True)
    assert inplace.grad_fn.name() != "NativeDropoutBackward0"  # dropout_ is unfused on CUDA too


class _Ops(TorchDispatchMode):
    """Records (op name, output dtype) of every operator."""

    def __init__(self):
        super().__init__()
        self.seen = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if isinstance(out, torch.Tensor):
            self.seen.append((func.__name__.split(".")[0], out.dtype))
        return out


def _autocast_dtypes(rules: bool):
    with FakeTensorMode():
        x = torch.empty(4, 16)
        weight = torch.nn.Parameter(torch.empty(16, 16))
        scope = cuda_rules.applied(A10) if rules else torch.enable_grad()
        with scope, cuda_rules.autocast("bf16-mixed", "cpu"), _Ops() as ops:
            h = F.linear(x, weight)
            h = F.linear(h, weight)  # the cast weight is reused within the region
            out = {
                "linear": h.dtype,
                "softmax": torch.softmax(h, -1).dtype,
                "layer_norm": F.layer_norm(h, (16,)).dtype,
                "sum": h.sum().dtype,
                "pow": h.pow(3).dtype,
                "gelu": F.gelu(h).dtype,
            }
        casts = [op for op in ops.seen if op == ("_to_copy", torch.bfloat16)]
        saved = (h.grad_fn._saved_self.dtype, h.grad_fn._saved_mat2.dtype)  # mm's inputs
        return out, saved, len(casts)


def test_autocast_follows_cuda_lists_lower_precision_matmuls_and_fp32_softmax_and_norms():
    dtypes, saved, casts = _autocast_dtypes(rules=True)
    assert dtypes == {
        "linear": torch.bfloat16,
        "softmax": torch.float32,
        "layer_norm": torch.float32,
        "sum": torch.float32,
        "pow": torch.float32,
        "gelu": torch.bfloat16,  # on neither list: runs in its input's dtype
    }
    assert saved == (torch.bfloat16, torch.bfloat16)  # a matmul's inputs are saved in bf16
    assert casts == 2  # x once, the weight once (cached), the bf16 hidden state not at all
    cpu_dtypes, _, _ = _autocast_dtypes(rules=False)
    assert cpu_dtypes["softmax"] == cpu_dtypes["layer_norm"] == torch.bfloat16  # CPU's lists


def test_autocast_emulation_honours_disabled_regions_and_stays_in_its_thread():
    seen = {}

    def other_thread():
        with torch.autocast("cpu", dtype=torch.bfloat16):
            seen["other"] = torch.softmax(torch.randn(2, 2, dtype=torch.bfloat16), -1).dtype

    with cuda_rules.applied(A10), cuda_rules.autocast("bf16-mixed", "cpu"):
        x = torch.randn(2, 2, dtype=torch.bfloat16)
        with torch.autocast("cpu", enabled=False):
            seen["disabled"] = torch.softmax(x, -1).dtype
        seen["here"] = torch.softmax(x, -1).dtype
        thread = threading.Thread(target=other_thread)
        thread.start()
        thread.join()
    assert seen == {"disabled": torch.bfloat16, "here": torch.float32, "other": torch.bfloat16}


def test_autocast_policies_cover_every_op_cuda_autocasts_in_this_pytorch():
    registered = torch._C._dispatch_get_registrations_for_dispatch_key("AutocastCUDA")
    on_cuda = {name.removeprefix("aten::") for name in registered}
    newer = {op for op in autocast_lists.NEWER_POLICIES if hasattr(torch.ops.aten, op)}
    assert on_cuda - autocast_lists.NOT_EMULATED == set(autocast_lists.POLICIES) | newer
    with cuda_rules.applied(A10):
        emulated = set(autocast_emulation.registered_ops())
    assert {"softmax.int", "layer_norm", "sum", "pow.Tensor_Scalar", "addmv"} <= emulated
    assert "mm" not in emulated  # CPU's own kernel already casts mm to lower precision


def test_patches_are_restored_and_apply_only_in_their_thread():
    original_sdpa, original_dropout = F.scaled_dot_product_attention, F.dropout
    other = {}
    with cuda_rules.applied(A10):
        patched = F.dropout is not original_dropout
        x = torch.randn(64, requires_grad=True)
        here = F.dropout(x, 0.5).grad_fn.name()

        def run():
            other["grad_fn"] = F.dropout(x, 0.5).grad_fn.name()

        thread = threading.Thread(target=run)
        thread.start()
        thread.join()
    assert patched and here == "NativeDropoutBackward0"
    assert other["grad_fn"] != "NativeDropoutBackward0"
    assert F.scaled_dot_product_attention is original_sdpa and F.dropout is original_dropout


def test_optimizers_are_built_as_cuda_picks_them():
    assert cuda_rules.optimizer_kwargs("adamw") == {"foreach": True}
    assert cuda_rules.optimizer_kwargs("sgd") == {"foreach": True}
    assert cuda_rules.optimizer_kwargs("adamw-fused") == {"fused": True}


def test_the_simulated_gpu_decides_the_kernels():
    # tiny-bert in bf16: flash attention on an A10; on a T4 (sm75) neither flash nor
    # mem-efficient takes bf16, so the math path keeps the attention matrices.
    settings = Settings(model="tiny-bert", seq_len=64, precision="bf16-mixed", backend="sim")
    session = Session(settings.replace(gpu="a10"))
    a10, gpu = session.open_backend(), session.gpu
    # a Session refuses bf16 on a T4 (no bf16 units); the kernel rule itself still holds.
    t4 = resolve(settings.replace(gpu="t4")).open_backend()
    assert (
        a10.compute_capability == gpu.compute_capability == gpus.find_gpu("A10").compute_capability
    )
    assert t4.compute_capability == T4
    assert t4.measure(8).peak_bytes > a10.measure(8).peak_bytes


def test_older_releases_named_overloads_follow_their_positional_twins():
    """PyTorch 2.11 autocasts named-tensor overloads on CUDA that 2.13 no longer registers
    (seen on an H100); each takes its positional twin's policy, so no warning fires there."""
    twins = {
        "softmax.Dimname": "softmax.int",
        "log_softmax.Dimname": "log_softmax.int",
        "prod.dim_Dimname": "prod.dim_int",
        "cumprod.dimname": "cumprod",
        "cumsum.dimname": "cumsum",
        "sum.dim_DimnameList": "sum.dim_IntList",
        "norm.names_ScalarOpt_dim": "norm.ScalarOpt_dim",
    }
    assert set(autocast_lists.OLDER_POLICIES) == set(twins)
    for older, twin in twins.items():
        assert autocast_lists.OLDER_POLICIES[older] == autocast_lists.POLICIES[twin]
    assert not set(autocast_lists.OLDER_POLICIES) & set(autocast_lists.POLICIES)


def test_newer_releases_ops_take_the_policy_2_14_registers():
    """2.14 adds linalg_matrix_sqrth and autocasts it to fp32 on CUDA (2.13 has no such op);
    knowing it, the emulation warns of no unknown op on either release."""
    assert autocast_lists.NEWER_POLICIES == {"linalg_matrix_sqrth": autocast_lists.FP32}
    assert not set(autocast_lists.NEWER_POLICIES) & set(autocast_lists.POLICIES)
    assert not set(autocast_lists.NEWER_POLICIES) & set(autocast_lists.OLDER_POLICIES)
    if not hasattr(torch.linalg, "matrix_sqrth"):
        assert versions.release() < (2, 14)
        return
    with cuda_rules.applied(A10), cuda_rules.autocast("bf16-mixed", "cpu"):
        root = torch.linalg.matrix_sqrth(torch.eye(3, dtype=torch.bfloat16))
    assert root.dtype == torch.float32
