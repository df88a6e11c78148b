"""A capped GPU that looks capped to CUDA itself: the rest of the card held by raw `cudaMalloc`.

`set_per_process_memory_fraction` (memorymark/calibration/run.py `capped`) caps PyTorch's caching
allocator only: `cudaMemGetInfo` still reports the whole card free. cuDNN's v8 API sizes its
workspace from that figure (aten/src/ATen/native/cudnn/Conv_v8.cpp `get_available_workspace`,
through `CUDACachingAllocator::cacheInfo`), so on an H100 capped to an A10 it may plan
workspaces a real A10 would filter out, and the cap then refuses them with a retry. A ballast
taken with the CUDA runtime's own `cudaMalloc`, outside PyTorch's allocator, lowers what
`cudaMemGetInfo` reports, as a smaller card would.

Owns the arithmetic (how much to hold, in which pieces) and holding it through a runtime object
with `cudaMalloc`, `cudaFree` and `cudaMemGetInfo` (`CudaRuntime`, ctypes on libcudart, thin; a
fake in tests). Must not know which GPU is emulated or how a step is measured.
"""

from __future__ import annotations

import ctypes
import glob
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

PIECE_BYTES = 1 << 30
"""The ballast is taken in 1 GiB pieces: one allocation of tens of GiB may fail where the same
bytes in pieces succeed, and the last piece takes the remainder."""
SLACK_BYTES = 2 << 20
"""Left free beyond the target capacity: the CUDA driver rounds each allocation up to its 2 MiB
page size (the granularity of cuMemGetAllocationGranularity on NVIDIA GPUs since Pascal), so the
allocator's own 2 MiB-rounded segments still fill the target exactly."""


class Runtime(Protocol):
    """The three CUDA runtime calls a ballast makes."""

    def mem_get_info(self) -> tuple[int, int]:
        """(free, total) bytes on the current device, as `cudaMemGetInfo` reports them."""
        ...

    def malloc(self, nbytes: int) -> int:
        """A device pointer to `nbytes` from `cudaMalloc`; raises MemoryError when it fails."""
        ...

    def free(self, pointer: int) -> None:
        """`cudaFree(pointer)`."""
        ...


def ballast_bytes(free_bytes: int, capacity_bytes: int) -> int:
    """How much to hold so that `capacity_bytes` (plus the driver's page slack) stay free.

    `free_bytes` is what `cudaMemGetInfo` says now, after PyTorch's allocator has emptied its
    cache and the CUDA context exists. Raises ValueError when less than `capacity_bytes` is
    free: a ballast can only shrink a GPU."""
    if capacity_bytes > free_bytes:
        raise ValueError(
            f"cannot leave {capacity_bytes} bytes free: only {free_bytes} are (a ballast can only "
            "shrink a GPU; is another process using it?)"
        )
    return max(0, free_bytes - capacity_bytes - SLACK_BYTES)


def pieces(total_bytes: int, piece_bytes: int = PIECE_BYTES) -> list[int]:
    """`total_bytes` as full pieces and a remainder, largest first."""
    full, rest = divmod(total_bytes, piece_bytes)
    return [piece_bytes] * full + ([rest] if rest else [])


@contextmanager
def held(runtime: Runtime, capacity_bytes: int) -> Iterator[int]:
    """Within the block, all but `capacity_bytes` of the device's free memory is held by raw
    `cudaMalloc` pieces (yields the bytes held); every piece is freed on the way out, also
    when the block raises or a piece could not be taken."""
    free_bytes, _ = runtime.mem_get_info()
    pointers: list[int] = []
    try:
        for size in pieces(ballast_bytes(free_bytes, capacity_bytes)):
            pointers.append(runtime.malloc(size))
        yield free_bytes - runtime.mem_get_info()[0]
    finally:
        for pointer in reversed(pointers):
            runtime.free(pointer)


class CudaRuntime:
    """`Runtime` on libcudart through ctypes: the one PyTorch loaded when it can be found (the
    nvidia-cuda-runtime wheel's, or the system's), so the ballast lives in the same CUDA context
    as PyTorch's allocations. Not exercised without a GPU."""

    def __init__(self, library: Any = None) -> None:
        self._lib = library if library is not None else ctypes.CDLL(find_cudart())

    def mem_get_info(self) -> tuple[int, int]:
        free, total = ctypes.c_size_t(), ctypes.c_size_t()
        self._check(self._lib.cudaMemGetInfo(ctypes.byref(free), ctypes.byref(total)), "MemGetInfo")
        return int(free.value), int(total.value)

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        code = self._lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(nbytes))
        if code != 0:
            raise MemoryError(f"cudaMalloc({nbytes}) failed with cudaError {code}")
        return int(pointer.value or 0)

    def free(self, pointer: int) -> None:
        self._check(self._lib.cudaFree(ctypes.c_void_p(pointer)), "Free")

    @staticmethod
    def _check(code: int, call: str) -> None:
        if code != 0:
            raise RuntimeError(f"cuda{call} failed with cudaError {code}")


def find_cudart(maps: str = "/proc/self/maps") -> str:
    """The path of libcudart: the copy this process already mapped (PyTorch's), else one in an
    nvidia wheel on sys.path, else the loader's `libcudart.so`. Raises OSError naming where
    it looked when none is found."""
    try:
        with open(maps) as f:
            loaded = [line.split()[-1] for line in f if "libcudart.so" in line]
    except OSError:
        loaded = []
    if loaded:
        return loaded[0]
    for root in sys.path:
        # nvidia/cuda_runtime/lib for CUDA 12's wheels, nvidia/cu13/lib for CUDA 13's.
        found = sorted(glob.glob(os.path.join(root, "nvidia", "*", "lib", "libcudart.so*")))
        if found:
            return found[-1]
    try:
        ctypes.CDLL("libcudart.so")
    except OSError as exc:
        raise OSError(
            "libcudart not found (not mapped by torch, not in an nvidia wheel on sys.path, not "
            f"on the loader's path): {exc}"
        ) from exc
    return "libcudart.so"
