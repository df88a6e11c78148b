"""CUDA's autocast op lists: which ops autocast casts on CUDA, and how (PyTorch 2.13 and 2.14).

Copied from aten/src/ATen/autocast_mode.cpp (`TORCH_LIBRARY_IMPL(aten, Autocast, m)`) and the
`AT_FORALL_*` macros of aten/src/ATen/autocast_mode.h, checked against this PyTorch's own
`AutocastCUDA` registrations by a test. Releases differ only at the edges: `OLDER_POLICIES` holds
what older releases registered and 2.13 dropped, `NEWER_POLICIES` what 2.14 added.
The policies (autocast_mode.h `CastPolicy`):
lower_precision_fp casts every floating input to the autocast dtype; fp32 casts them to fp32;
fp32_set_opt_dtype asks for an fp32 output unless the caller named a dtype; fp32_append_dtype
redispatches to the overload that takes one; promote runs in the widest input type. CPU's lists
(`AutocastCPU`) differ: they leave softmax, log_softmax, layer_norm, sum, pow, exp... in the
input dtype, where CUDA runs them in fp32.
Data only: knows nothing of how the lists are applied.
"""

from __future__ import annotations

LOWER = "lower_precision_fp"
FP32 = "fp32"
SET_OPT_DTYPE = "fp32_set_opt_dtype"
APPEND_DTYPE = "fp32_append_dtype"
PROMOTE = "promote"

_LOWER_OPS = (
    "_convolution _convolution.deprecated conv1d conv2d conv3d conv_tbc conv_transpose1d "
    "conv_transpose2d.input conv_transpose3d.input convolution prelu addmm addmv addr matmul "
    "einsum mm mv linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot "
    "_thnn_fused_lstm_cell _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell "
    "_scaled_dot_product_flash_attention scaled_dot_product_attention"
)
_FP32_OPS = (
    "acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan "
    "pow.Tensor_Scalar pow.Tensor_Tensor pow.Scalar softplus layer_norm native_layer_norm rms_norm "
    "group_norm frobenius_norm.dim nuclear_norm nuclear_norm.dim cosine_similarity "
    "poisson_nll_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div "
    "l1_loss smooth_l1_loss huber_loss mse_loss margin_ranking_loss multilabel_margin_loss "
    "soft_margin_loss triplet_margin_loss multi_margin_loss binary_cross_entropy_with_logits dist "
    "pdist cdist renorm logsumexp upsample_nearest1d _upsample_nearest_exact1d upsample_nearest2d "
    "_upsample_nearest_exact2d upsample_nearest3d _upsample_nearest_exact3d upsample_linear1d "
    "upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d "
    "_upsample_bicubic2d_aa"
)
_SET_OPT_DTYPE_OPS = (
    "prod prod.dim_int softmax.int log_softmax.int cumprod cumsum linalg_vector_norm "
    "linalg_matrix_norm linalg_matrix_norm.str_ord sum sum.dim_IntList"
)
_PROMOTE_OPS = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot"
_PROMOTE_OPS += " scatter_add"

POLICIES: dict[str, str] = {
    **dict.fromkeys(_LOWER_OPS.split(), LOWER),
    **dict.fromkeys(_FP32_OPS.split(), FP32),
    **dict.fromkeys(_SET_OPT_DTYPE_OPS.split(), SET_OPT_DTYPE),
    **dict.fromkeys(("norm.Scalar", "norm.ScalarOpt_dim"), APPEND_DTYPE),
    **dict.fromkeys(_PROMOTE_OPS.split(), PROMOTE),
}
"""CUDA's autocast policy of every op overload 2.13 autocasts (2.14 autocasts these too)."""

# fp32_append_dtype redispatches to the overload that takes an output dtype.
APPEND_TARGET = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
# Registered for CUDA but never reached by a CPU tensor, or refused on CUDA (not emulated).
# `_cudnn_rnn` has its own autocast kernel in CUDA builds (aten/src/ATen/cudnn/AutocastRNN.cpp);
# a CPU tensor takes the native RNN path instead.
NOT_EMULATED = frozenset(
    {"cudnn_convolution", "cudnn_convolution_transpose", "binary_cross_entropy", "_cudnn_rnn"}
)

OLDER_POLICIES: dict[str, str] = {
    **dict.fromkeys(
        (
            "softmax.Dimname",
            "log_softmax.Dimname",
            "prod.dim_Dimname",
            "cumprod.dimname",
            "cumsum.dimname",
            "sum.dim_DimnameList",
        ),
        SET_OPT_DTYPE,
    ),
    "norm.names_ScalarOpt_dim": APPEND_DTYPE,
}
"""Overloads older releases autocast on CUDA and 2.13 no longer registers: the named-tensor
overloads, with the policy of their positional twins (seen registered by PyTorch 2.11.0+cu130
on an H100; autocast_mode.cpp of that release lists them beside those twins)."""

NEWER_POLICIES: dict[str, str] = {"linalg_matrix_sqrth": FP32}
"""Overloads 2.14 autocasts on CUDA that 2.13 does not have (the op is new in 2.14).

2.14.1+cu130's libtorch_cpu.so instantiates `WrapFunction_<CastPolicy::fp32, DeviceType::CUDA,
..., &at::_ops::linalg_matrix_sqrth::call>` beside its other `KERNEL_CUDA` registrations (the
header's `AT_FORALL_*` lists are byte-identical to 2.13's, so autocast_mode.cpp registers it by
name, as it does `cudnn_convolution`); under CUDA autocast a bf16 input is cast to fp32 first (run
on fake CUDA tensors of that build). Every other CUDA policy is the same in 2.13.0 and 2.14.1.
2.14 registers fp32 for it on CPU too (`AutocastCPU`), so the emulation keeps CPU's kernel."""
