"""One rank of a many-GPU step, simulated with PyTorch's own DDP, ZeRO and FSDP2 code.

`DistSimBackend` is the simulated backend (fake tensors, the caching-allocator replay) with the
model spread over a *fake process group*: PyTorch's testing backend
(`torch.testing._internal.distributed.fake_pg`, `init_process_group("fake", ...)`), whose
collectives return at once without moving data. So `fully_shard` really shards, DDP really
builds its gradient buckets, `ZeroRedundancyOptimizer` really partitions, and the tracker counts
what rank 0 holds. Ranks are symmetric except for uneven shards (FSDP2 pads every shard to the
same size, so it loses nothing; ZeRO-1's greedy partition can give another rank a few more
bytes of optimizer state than rank 0).

The default process group is process-wide, so one simulation holds it at a time (a lock taken
when the backend builds its model and given back at `release`); it is created with the rank
count asked for and destroyed after, so sweeps with other counts can follow in the same
process. The `DeviceMesh` is built outside fake mode (it holds a real tensor of ranks).

Tensor and context parallelism (`--tp`, `--cp`) build the mesh from torchtitan's layout
(memorymark/distributed/layout.py) and slice its tp, cp and FSDP sub-meshes here, outside fake
mode; FSDP2 concatenates its mesh with tensor parallelism's for each parameter, which runs with
the fake and tracking modes set aside (a mesh is ranks, not memory). The step runs inside
`loss_parallel()` and the ring attention (`parallel_contexts`).

Three accommodations make DDP trace on fake tensors, each standing for what a real step does
with no effect on memory: the parameter-shape check and the initial broadcast are skipped
(they read values); a comm hook stands for the all-reduce (in place on the bucket, as the
built-in hook: torch/csrc/distributed/c10d/reducer.cpp); and buckets are not rebuilt after the
first step (the rebuild only reorders them in gradient-ready order; their total is the same).
This module knows nothing about search or reports.
"""

from __future__ import annotations

import contextlib
import functools
import operator
import sys
import threading
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, overload

import torch
import torch.distributed as dist
from torch import nn

from memorymark.backends import sharding
from memorymark.backends.sim import SimBackend
from memorymark.cuda_rules.scoped_patch import ScopedPatch
from memorymark.measurement import Category

_GROUP_LOCK = threading.Lock()
"""Held by the one simulation whose fake default process group exists."""


@contextlib.contextmanager
def fake_group(world_size: int, rank: int = 0) -> Iterator[None]:
    """A fake default process group of `world_size` ranks, this process being `rank`."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise ValueError(
            "a process group already exists in this process (torchrun?): a simulation of "
            "many GPUs needs its own; use --backend cuda under torchrun to measure for real"
        )
    # init_process_group wraps sys.excepthook to prefix "[rankN]:" to tracebacks, once per
    # group: a process that simulates many would prefix them over and over.
    hook = sys.excepthook
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
    try:
        yield
    finally:
        dist.destroy_process_group()
        sys.excepthook = hook


def _skip(original: object, *args: object, **kwargs: object) -> None:
    return None


@functools.cache
def _ddp_patches() -> tuple[ScopedPatch, ...]:
    import torch.nn.parallel.distributed as ddp_module

    # Both read tensor values across ranks (shapes checked, rank 0's weights broadcast).
    return (
        ScopedPatch(ddp_module, "_verify_param_shape_across_processes", _skip),
        ScopedPatch(ddp_module, "_sync_module_states", _skip),
    )


_labelling = threading.local()
"""The tracker FSDP2's gradient shards are labelled in, per thread (None: not simulating)."""


def _post_backward_labelled(original: Any, group: Any, *args: Any) -> Any:
    # FSDP2 assigns each reduce-scattered gradient shard itself, past the hook that labels
    # gradients: label them as its post-backward leaves them, so the peak's breakdown has them.
    result = original(group, *args)
    tracker = getattr(_labelling, "tracker", None)
    if tracker is not None:
        grads = [p.sharded_param.grad for p in group.fsdp_params]
        grads = [g for g in grads if g is not None]
        if getattr(group, "offload_policy", None) is not None and _offloads(group):
            tracker.to_host(grads)  # copied to host memory; the device's copy is freed
        else:
            tracker.track_all(grads, Category.GRADIENTS)
    return result


def _offloads(group: Any) -> bool:
    from torch.distributed.fsdp import CPUOffloadPolicy

    return isinstance(group.offload_policy, CPUOffloadPolicy)


def _storage_resized(original: Any, tensor: torch.Tensor) -> None:
    # FSDP2 frees a gathered parameter by resizing its storage to 0 and gathers the next one
    # into the same storage: memory a storage's creation and death alone would not show.
    original(tensor)
    tracker = getattr(_labelling, "tracker", None)
    if tracker is not None:
        tracker.resized(tensor, Category.PARAMETERS)


_FSDP_STREAMS = (
    "all_gather_copy_in_stream",
    "all_gather_stream",
    "reduce_scatter_stream",
    "all_reduce_stream",
)
"""FSDP2's own streams (`FSDPCommContext.lazy_init` in torch/distributed/fsdp/_fully_shard/
_fsdp_param_group.py), numbered 1 on in this order for the allocator replay: the gathered
parameters' flat buffer is allocated on the copy-in stream, the reduce-scatter output and the
sharded gradients on the reduce-scatter stream (`foreach_all_gather`, `foreach_reduce` in
_fsdp_collectives.py), and the caching allocator serves each stream from its own blocks."""
_stream_numbers: weakref.WeakKeyDictionary[Any, int] = weakref.WeakKeyDictionary()


def _streams_numbered(original: Any, context: Any, *args: Any) -> None:
    original(context, *args)
    for number, name in enumerate(_FSDP_STREAMS, 1):
        stream = getattr(context, name, None)
        if stream is not None:
            _stream_numbers[stream] = number


def _current_stream() -> int:
    # The simulated device is the CPU, whose `torch.cpu.stream(s)` FSDP2 enters as it would a
    # CUDA stream's context: the current one is FSDP2's or the default (0).
    return _stream_numbers.get(torch.cpu.current_stream(), 0)


@functools.cache
def _fsdp_patches() -> tuple[ScopedPatch, ...]:
    from torch.distributed.fsdp._fully_shard import _fsdp_param, _fsdp_param_group

    return (
        ScopedPatch(_fsdp_param_group.FSDPParamGroup, "post_backward", _post_backward_labelled),
        ScopedPatch(_fsdp_param, "alloc_storage", _storage_resized),
        ScopedPatch(_fsdp_param, "free_storage", _storage_resized),
        ScopedPatch(_fsdp_param_group, "alloc_storage", _storage_resized),
        ScopedPatch(_fsdp_param_group.FSDPCommContext, "lazy_init", _streams_numbered),
    )


class RankChunks(Sequence[torch.Tensor]):
    """What FSDP2's `_chunk_with_empty(tensor, num_chunks, dim)` returns (torch.chunk's pieces,
    then empty tensors up to `num_chunks`), each piece made only when read.

    FSDP2 reads two pieces of a parameter (its rank's and the first, for the padded size), but
    torch.chunk makes all of them: one fake tensor per rank and parameter, so sharding over
    512 fake ranks took longer than stepping the model (20 s of Llama-3.1-70B's 44 s at 4
    blocks, on a 2-core machine). The pieces are the same views: torch.chunk splits into pieces
    of ceil(size / num_chunks) along `dim`, the last shorter, fewer than `num_chunks` where the
    size runs out (or `num_chunks` empty ones of an empty size)."""

    def __init__(self, tensor: torch.Tensor, num_chunks: int, dim: int) -> None:
        self._tensor, self._count, self._dim = tensor, num_chunks, dim
        self._size = tensor.size(dim)
        self._step = -(-self._size // num_chunks)
        # torch.chunk of an empty dimension gives `num_chunks` empty pieces of its shape.
        self._made = -(-self._size // self._step) if self._size else num_chunks

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, index: int) -> torch.Tensor: ...

    @overload
    def __getitem__(self, index: slice) -> list[torch.Tensor]: ...

    def __getitem__(self, index: int | slice) -> torch.Tensor | list[torch.Tensor]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(self._count))]
        i = operator.index(index)
        i += self._count if i < 0 else 0
        if not 0 <= i < self._count:
            raise IndexError(f"chunk {index} of {self._count}")
        if i >= self._made:
            return self[0].new_empty(0)
        start = min(i * self._step, self._size)
        return self._tensor.narrow(self._dim, start, min(self._step, self._size - start))


def _rank_chunks(original: Any, tensor: torch.Tensor, num_chunks: int, dim: int) -> Any:
    return RankChunks(tensor, num_chunks, dim)


def _outside_fake_mode(original: Any, *args: Any) -> Any:
    # A DeviceMesh holds a real tensor of ranks, which fake mode cannot make (see the module
    # docstring): FSDP2 concatenates its mesh with tensor parallelism's for each parameter.
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        return original(*args)


@functools.cache
def _sharding_patches() -> tuple[ScopedPatch, ...]:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp._fully_shard import _fsdp_param

    return (
        ScopedPatch(_fsdp_param, "_chunk_with_empty", _rank_chunks),
        ScopedPatch(_StaticMethods(DeviceMesh), "_concatenate", _outside_fake_mode),
    )


class _StaticMethods:
    """A class's static methods as attributes a `ScopedPatch` sets: what it sets (and puts
    back) stays a staticmethod."""

    def __init__(self, owner: type) -> None:
        object.__setattr__(self, "_owner", owner)

    def __getattr__(self, name: str) -> Any:
        return getattr(object.__getattribute__(self, "_owner"), name)

    def __setattr__(self, name: str, value: Any) -> None:
        setattr(object.__getattribute__(self, "_owner"), name, staticmethod(value))


@contextlib.contextmanager
def fsdp_reported_to(tracker: Any | None) -> Iterator[None]:
    """In this thread, FSDP2 reports its gradient shards and its parameters' storage resizes
    to `tracker` (any backend whose tracker counts FSDP2's tensors needs this), and the tracker
    logs which of FSDP2's streams each allocation is made on."""
    with contextlib.ExitStack() as stack:
        for patch in _fsdp_patches():
            stack.enter_context(patch.active())
        previous, _labelling.tracker = getattr(_labelling, "tracker", None), tracker
        streams = getattr(tracker, "stream_of", None)
        if tracker is not None:
            tracker.stream_of = _current_stream
        try:
            yield
        finally:
            _labelling.tracker = previous
            if tracker is not None:
                tracker.stream_of = streams


def _allreduce_in_place(world_size: int, bucket: Any) -> torch.futures.Future:
    # What DDP's built-in all-reduce does to the bucket's memory: divide and reduce in place.
    buffer = bucket.buffer()
    buffer.div_(world_size)
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(buffer)
    return future


class _NoRebuild:
    """DDP's reducer, except that buckets are never rebuilt (see the module docstring)."""

    def __init__(self, reducer: Any) -> None:
        self._reducer = reducer

    def __getattr__(self, name: str) -> Any:
        return getattr(self._reducer, name)

    def _rebuild_buckets(self) -> bool:
        return False


def parallel_contexts(parts: dict[str, Any]) -> list[contextlib.AbstractContextManager[Any]]:
    """What a step under tensor or context parallelism runs inside (`parts`:
    `sharding.mesh_parts`): `loss_parallel()` for the vocabulary-split logits
    (tensor_parallel.py), ring attention over the cp ranks (context_parallel.py)."""
    from memorymark.backends import context_parallel, tensor_parallel

    contexts: list[contextlib.AbstractContextManager[Any]] = []
    if "tp" in parts:
        contexts.append(tensor_parallel.loss_parallel_context(True))
    if "cp" in parts:
        contexts.append(context_parallel.ring_attention(parts["cp"]))
    return contexts


_last_rank: list[int] = [0]
"""The rank the last fake process group was opened as (one group at a time: `_GROUP_LOCK`)."""


def _forget_other_ranks_meshes(rank: int) -> None:
    """Empty DTensor's sharding-propagation cache when this process simulates another rank than
    the last group did. A `DeviceMesh` compares equal to another of the same layout over the
    same world whatever this rank's coordinate (torch/distributed/device_mesh.py `__eq__`), so
    rank 0's tp mesh and rank 2's look the same to the cache, and an answer cached for rank 0
    would hand rank 2 a mesh whose process group no longer exists (pipeline ranks beside
    tensor parallelism)."""
    if rank == _last_rank[0]:
        return
    _last_rank[0] = rank
    # Python's cache and the C++ dispatch fast path's (torch/distributed/tensor/debug).
    from torch.distributed.tensor import debug

    debug._clear_sharding_prop_cache()


class DistSimBackend(SimBackend):
    """Simulates rank 0 of `settings.hardware.gpu_count` GPUs under `settings.hardware.dist`."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stack: contextlib.ExitStack | None = None
        self._mesh: Any = None
        self._parts: dict[str, Any] = {}
        """The mesh's tp, cp and FSDP sub-meshes (`sharding.mesh_parts`), sliced outside fake
        mode."""
        self.rank = 0
        """The rank simulated (pipeline stages differ by rank; data-parallel ranks do not)."""
        self._group_owner: DistSimBackend | None = None
        """The backend whose process group this one uses (the depth replay's shallower builds
        share one: the group is process-wide); None: its own."""

    def shallower(self, step: Any, group_owner: SimBackend | None = None) -> SimBackend:
        backend = super().shallower(step)
        assert isinstance(backend, DistSimBackend)
        backend._group_owner = group_owner if isinstance(group_owner, DistSimBackend) else None
        return backend

    @property
    def world_size(self) -> int:
        """Ranks simulated: the GPUs asked for."""
        count = self.training_step.settings.hardware.gpu_count
        if count is None:
            raise ValueError("give a GPU count: --gpus auto is for analyze, which searches it")
        return count

    def _open_group(self) -> None:
        if self._group_owner is not None:
            self._group_owner._open_group()
            self._mesh = self._group_owner._mesh
            self._parts = self._group_owner._parts
            return
        if self._stack is not None:
            return
        stack = contextlib.ExitStack()
        if not _GROUP_LOCK.acquire(timeout=600):
            raise RuntimeError("another simulation of many GPUs held the process group for 10 min")
        stack.callback(_GROUP_LOCK.release)
        try:
            stack.enter_context(fake_group(self.world_size, self.rank))
            from torch.distributed.device_mesh import init_device_mesh

            shape, names = self._mesh_shape()
            _forget_other_ranks_meshes(self.rank)
            self._mesh = init_device_mesh("cpu", shape, mesh_dim_names=names)
            self._parts = sharding.mesh_parts(self._mesh)
        except BaseException:
            stack.close()
            raise
        self._stack = stack

    def _mesh_shape(self) -> tuple[tuple[int, ...], tuple[str, ...]]:
        """(shape, dimension names) of the device mesh this rank's step runs on."""
        return sharding.mesh_shape(self.training_step.settings)

    def _build_model(self) -> nn.Module:
        self._open_group()
        return super()._build_model()

    @contextlib.contextmanager
    def _step_context(self) -> Iterator[None]:
        with super()._step_context(), contextlib.ExitStack() as stack:
            for patch in _ddp_patches():
                stack.enter_context(patch.active())
            stack.enter_context(fsdp_reported_to(self._tracker))
            for context in parallel_contexts(self._parts):
                stack.enter_context(context)
            yield

    def _distribute(self, model: nn.Module) -> nn.Module:
        settings = self.training_step.settings
        with contextlib.ExitStack() as stack:
            for patch in _sharding_patches():
                stack.enter_context(patch.active())
            sharded = sharding.shard_model(
                model, settings, self._mesh, {}, pin_memory=False, parts=self._parts
            )
        if isinstance(sharded, nn.parallel.DistributedDataParallel):
            sharded.register_comm_hook(
                None, lambda _, bucket: _allreduce_in_place(self.world_size, bucket)
            )
            sharded.reducer = _NoRebuild(sharded.reducer)
        return sharded

    def _prepare(self) -> Any:
        tracker = super()._prepare()
        if self.training_step.settings.hardware.offload == "cpu" and self._model is not None:
            # CPUOffloadPolicy: parameter shards and optimizer state live in host memory.
            optimizer = self._optimizer
            tracker.to_host(
                [*self._model.parameters(), *(optimizer.state.values() if optimizer else ())]
            )
        return tracker

    def _run_optimizer(self, optimizer_phase: Any) -> None:
        tracker = self._tracker
        if self.training_step.settings.hardware.offload != "cpu" or tracker is None:
            super()._run_optimizer(optimizer_phase)
            return
        # With CPUOffloadPolicy the optimizer steps on the CPU: nothing it allocates is the GPU's.
        tracker.host_allocations = True
        try:
            optimizer_phase()
        finally:
            tracker.host_allocations = False

    def _build_optimizer(self, model: nn.Module) -> torch.optim.Optimizer | None:
        if self.training_step.settings.workload.forward_only:
            return None
        return sharding.build_optimizer(self.training_step.settings, model, self._mesh)

    def release(self) -> None:
        super().release()
        self._mesh = None
        self._parts = {}
        if self._stack is not None:
            stack, self._stack = self._stack, None
            stack.close()
