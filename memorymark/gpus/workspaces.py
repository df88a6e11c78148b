"""The cuBLAS and cuBLASLt workspaces a training step keeps allocated, by GPU and torch release.

Owns `thread_workspace` (the requests one thread makes at its first cuBLAS call, outside the
tensors a step creates; the simulation's tracker logs them there, in the forward and in the
backward) and `workspace_allocations` (all of a step's: one set per thread). Must not know
torch, devices, the catalog or how anything is displayed: it is handed a compute capability and a
release.
"""

from __future__ import annotations

# cuBLAS workspace, pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp (read at 26a39059
# and checked in the libtorch_cuda.so of every release 2.5.1 to 2.15.0): parseChosenWorkspaceSize
# defaults to ":4096:2:16:8", i.e. 4096*1024*2 + 16*1024*8 B, and to 32 MiB on compute capability
# 9.0 (2.5-2.11), majors 9, 10 and 12 (2.12-2.13, pytorch#175344), majors 9-12 (2.14 on).
_CUBLAS_WORKSPACE_BYTES = 4096 * 1024 * 2 + 16 * 1024 * 8
_CUBLAS_WORKSPACE_LARGE_BYTES = 4096 * 8 * 1024
# cuBLASLt workspace, same file: CUBLASLT_WORKSPACE_SIZE defaults to 1024 KiB. Kept per (handle,
# stream) from 2.9 (pytorch#156495); shared with the cuBLAS one by default from 2.12 (so it adds
# nothing); before 2.9 allocated and freed around each call (a transient, not modelled).
_CUBLASLT_WORKSPACE_BYTES = 1024 * 1024
# Workspaces are kept per (cuBLAS handle, stream) and handles are per CPU thread (thread-local
# PoolWindow, same file); autograd runs CUDA backward on its own device thread, so a training step
# holds two sets: the forward thread's and the backward thread's. getNewWorkspace() takes them
# from the caching allocator (`c10::cuda::CUDACachingAllocator::get()->allocate(size)`), so they
# count in memory_allocated/reserved: the allocator replay serves them, they are not overhead.
# From 2.15 they are no longer kept unless TORCH_CUBLAS_WORKSPACE_CACHE=1: each call allocates
# and frees its own (transient, not modelled), so nothing stays resident.
_WORKSPACE_SETS = 2


def workspace_allocations(
    compute_capability: tuple[int, int], torch_release: tuple[int, int]
) -> tuple[int, ...]:
    """The cuBLAS/cuBLASLt workspace requests a training step keeps allocated through the
    caching allocator on a GPU of `compute_capability` under torch `torch_release` (major,
    minor): one set per thread that runs matmuls."""
    return thread_workspace(compute_capability, torch_release) * _WORKSPACE_SETS


def thread_workspace(
    compute_capability: tuple[int, int], torch_release: tuple[int, int]
) -> tuple[int, ...]:
    """The workspace requests one thread makes at its first cuBLAS call and keeps, on a GPU of
    `compute_capability` under torch `torch_release`: the forward's at the step's first matmul,
    the backward's at the first matmul of the backward pass, when many blocks the forward freed
    are cached (so it is carved from one of them: docs/calibration/README.md)."""
    if torch_release >= (2, 15):
        return ()
    major, minor = compute_capability
    if torch_release >= (2, 14):
        large = 9 <= major <= 12
    elif torch_release >= (2, 12):
        large = major in (9, 10, 12)
    else:
        large = (major, minor) == (9, 0)
    cublas = _CUBLAS_WORKSPACE_LARGE_BYTES if large else _CUBLAS_WORKSPACE_BYTES
    lt_kept = (2, 9) <= torch_release < (2, 12)
    return (cublas, _CUBLASLT_WORKSPACE_BYTES) if lt_kept else (cublas,)
