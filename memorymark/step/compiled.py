"""The step people compile: `torch.compile` on a model's blocks, and in the simulation, the
graphs it makes run so that memory is counted as the compiled code allocates it.

Compiling follows torchtitan's `apply_compile` (torchtitan/models/llama3/infra/parallelize.py):
each transformer block is compiled in place (`nn.Module.compile`), so FSDP2 and checkpointing
wrap the same modules as eagerly; a model with no blocks (timm, torchvision) is compiled whole.
On a real device the backend is Inductor. In the simulation it is `simulated_backend`: Dynamo
captures the block, AOTAutograd (`aot_module_simplified`, with Inductor's decompositions,
`select_decomp_table`) splits forward and backward with Inductor's own `partition_fn`
(torch/_inductor/compile_fx.py: its joint-graph passes, then
`min_cut_rematerialization_partition(..., compiler="inductor")` from torch/_functorch/
partitioners.py, under `torch._functorch.config.activation_memory_budget`), and each graph runs
node by node on the fake tensors (`_GraphRunner`), its values freed after their last use as
Inductor's generated code frees its buffers (`del buf` once dead), its inputs list cleared as
AOTAutograd's boxed calling convention lets it (so saved activations go during backward).

Fusion is modelled by an equivalent of Inductor's scheduling, not by running it
(`fused_intermediates`): Inductor inlines a pointwise op into the kernel that consumes it
(torch/_inductor/lowering.py makes pointwise ops `Pointwise` IR nodes, realized into buffers only
when they must be: a graph output, an input of an extern kernel such as mm or SDPA, or a
reduction's result, torch/_inductor/ir.py `realize`; torch/_inductor/scheduler.py then fuses the
realized buffers' kernels and removes buffers used only inside one fused kernel). So here an
output of a pointwise op (aten ops tagged `torch.Tag.pointwise`) that no extern kernel, no
graph output and no non-pointwise op reads has no allocation; everything else does. PyTorch's
own torch/_inductor/fx_passes/memory_estimator.py estimates a graph's peak by liveness over the
same nodes; here the counted allocations go through the tracker and the caching-allocator
replay like an eager step's. What this leaves out: Inductor's realizing of a pointwise value
read by many consumers (`realize_reads_threshold`), its in-place buffer reuse, and the
workspace of its Triton kernels.

Graph breaks: each break Dynamo takes is recorded (`graph_breaks`) with its reason and place,
and the broken region runs eagerly (Dynamo's own fallback), counted as an eager step is.

Must not know settings' sections, backends or how memory is counted beyond the tracker's
`uncounted()` switch.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import fx, nn

from memorymark.accounting.tracker import uncounted

_state = threading.local()


@dataclass(frozen=True, slots=True)
class GraphBreak:
    """One place Dynamo stopped capturing a graph: the region after it runs eagerly."""

    reason: str
    """Dynamo's reason, first line."""
    where: str
    """file:line of the user code it broke at, when Dynamo says."""


@dataclass(slots=True)
class CompiledGraphs:
    """What the simulated backend compiled: the partitioned graphs and where it broke."""

    forward: list[fx.GraphModule]
    backward: list[fx.GraphModule]
    breaks: list[GraphBreak]

    def saved_for_backward(self) -> list[fx.Node]:
        """The forward graphs' outputs the partitioner saves for backward (past the user's
        outputs): AOTAutograd's `num_fw_outs_saved_for_bw`, read off the graph."""
        saved: list[fx.Node] = []
        for gm in self.forward:
            outs: Any = gm.graph.output_node().args[0]
            count = gm.meta.get("saved_count", 0)
            saved.extend(o for o in outs[len(outs) - count :] if isinstance(o, fx.Node))
        return saved


def log() -> CompiledGraphs:
    """What this thread's simulated compiles made since `reset_log` (the last graphs kept)."""
    found = getattr(_state, "log", None)
    if found is None:
        found = _state.log = CompiledGraphs([], [], [])
    return found


def reset_log() -> None:
    """Forget what was compiled in this thread."""
    _state.log = CompiledGraphs([], [], [])


# -- fusion -----------------------------------------------------------------------------------
def _pointwise(node: fx.Node) -> bool:
    target = node.target
    tags = getattr(target, "tags", ())
    return node.op == "call_function" and torch.Tag.pointwise in tags


def fused_intermediates(gm: fx.GraphModule) -> set[fx.Node]:
    """The nodes whose outputs Inductor would keep inside a fused kernel (see the module doc):
    pointwise ops read only by pointwise ops, and by no graph output."""
    output = gm.graph.output_node()
    fused = set()
    for node in gm.graph.nodes:
        if not _pointwise(node) or not node.users:
            continue
        if all(u is not output and _pointwise(u) for u in node.users):
            fused.add(node)
    return fused


class _GraphRunner(fx.Interpreter):
    """Runs a partitioned graph node by node, each value dropped after its last use, the
    outputs of fused intermediates uncounted."""

    def __init__(self, gm: fx.GraphModule, fuse: bool) -> None:
        super().__init__(gm, garbage_collect_values=True)
        self.fused = fused_intermediates(gm) if fuse else set()

    def run_node(self, n: fx.Node) -> Any:
        if n in self.fused:
            with uncounted():
                return super().run_node(n)
        return super().run_node(n)


def _boxed_runner(gm: fx.GraphModule, fuse: bool) -> Callable[[list[Any]], Any]:
    runner = _GraphRunner(gm, fuse)

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]

    def run(args: list[Any]) -> Any:
        # AOTAutograd's boxed convention: the callee owns the list and clears it, so each
        # input (a saved activation in backward) dies at its last use, as in Inductor's code.
        # The inputs go in as the interpreter's environment, which drops each value after its
        # last use (`Interpreter.boxed_run`'s way), not as `run`'s arguments, whose tuple its
        # argument iterator would hold to the end of the graph and past it, to the next call.
        env = dict(zip(placeholders, args, strict=True))
        args.clear()
        try:
            return runner.run(initial_env=env)
        finally:
            runner.env = {}  # what the graph returned and inputs it never read

    run._boxed_call = True  # type: ignore[attr-defined]
    return run


def inductor_backend(budget: float = 1.0) -> Any:
    """Inductor, its partitioner under `activation_memory_budget` = `budget`: the backend a
    real device compiles with."""
    if budget == 1.0:
        return "inductor"

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        from torch._inductor.compile_fx import compile_fx

        with torch._functorch.config.patch(activation_memory_budget=budget):
            return compile_fx(gm, example_inputs)

    return backend


def simulated_backend(budget: float = 1.0, fuse: bool = True) -> Callable[..., Any]:
    """A `torch.compile` backend for fake tensors: AOTAutograd with Inductor's partitioner
    under `activation_memory_budget` = `budget`, the graphs run by `_GraphRunner` (fusion
    modelled unless `fuse` is False)."""
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch._inductor.compile_fx import partition_fn as inductor_partition
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.virtualized import V

    def compiler(kind: str) -> Callable[..., Any]:
        def compile_graph(gm: fx.GraphModule, example_inputs: Any) -> Any:
            graphs = log()
            if kind == "forward":
                graphs.forward.append(gm)
            else:
                graphs.backward.append(gm)
            return _boxed_runner(gm, fuse)

        return compile_graph

    def partition(joint: fx.GraphModule, joint_inputs: Any, **kwargs: Any) -> Any:
        # Inductor's own: its joint-graph passes (pattern rewrites such as attention fusion),
        # then `min_cut_rematerialization_partition(..., compiler="inductor")`.
        fake_mode = torch._guards.detect_fake_mode(joint_inputs)
        with (
            V.set_fake_mode(fake_mode),  # as compile_fx sets it for its passes
            torch._functorch.config.patch(activation_memory_budget=budget),
        ):
            fw, bw = inductor_partition(joint, joint_inputs, **kwargs)
        # What the partitioner saves: the forward's outputs the backward takes as inputs
        # (past the tangents' placeholders, which name `tangents_`).
        bw_inputs = [n for n in bw.graph.nodes if n.op == "placeholder"]
        fw.meta["saved_count"] = sum(1 for n in bw_inputs if not n.name.startswith("tangents"))
        return fw, bw

    def backend(gm: fx.GraphModule, example_inputs: Any) -> Any:
        return aot_module_simplified(
            gm,
            example_inputs,
            fw_compiler=compiler("forward"),
            bw_compiler=compiler("backward"),
            partition_fn=partition,
            # Inductor's decompositions (compile_fx's `select_decomp_table`): the partitioner
            # sees the ops Inductor lowers, so it recomputes what Inductor would.
            decompositions=select_decomp_table(),
        )

    return backend


# -- graph breaks -----------------------------------------------------------------------------
@contextlib.contextmanager
def breaks_recorded() -> Iterator[None]:
    """Record in `log().breaks` every graph break Dynamo takes in the block."""
    from torch._dynamo import symbolic_convert

    # Dynamo's one place a break is logged (torch/_dynamo/symbolic_convert.py), wrapped for
    # the block: its reason and the instruction's file and line.
    original = symbolic_convert.InstructionTranslatorBase.__dict__.get("log_graph_break")
    if original is None:  # a PyTorch without the hook: breaks still fall back to eager
        yield
        return

    def log_graph_break(self: Any, code_options: Any, reason: str = "", **kwargs: Any) -> Any:
        frame = getattr(self, "f_code", None)
        line = getattr(self, "lineno", None)
        where = f"{frame.co_filename}:{line}" if frame is not None else "?"
        first = str(reason).strip().splitlines()[0] if str(reason).strip() else "graph break"
        log().breaks.append(GraphBreak(first, where))
        return original(self, code_options, reason=reason, **kwargs)

    symbolic_convert.InstructionTranslatorBase.log_graph_break = log_graph_break  # type: ignore[method-assign,assignment]
    try:
        yield
    finally:
        symbolic_convert.InstructionTranslatorBase.log_graph_break = original  # type: ignore[method-assign]


@contextlib.contextmanager
def dynamo_quiet() -> Iterator[None]:
    """Without the warning Dynamo's own tracing raises when it reads `.grad` of an activation
    (torch/_dynamo/variables/builder.py wraps every tensor it meets, leaf or not): it is about
    Dynamo's internals, not the user's code."""
    with warnings.catch_warnings():
        warnings.filterwarnings(
            "ignore",
            message="The .grad attribute of a Tensor that is not a leaf",
            category=UserWarning,
        )
        yield


# -- compiling a model ------------------------------------------------------------------------
def blocks(model: nn.Module) -> list[nn.Module]:
    """The transformer blocks torchtitan compiles one by one: transformers'
    `GradientCheckpointingLayer`s, in module order; empty for a model without them."""
    try:
        from transformers.modeling_layers import GradientCheckpointingLayer
    except ImportError:
        return []
    return [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]


def compile_model(model: nn.Module, backend: Any, *, whole: bool = False) -> None:
    """Compile `model` in place with `backend`: each block (torchtitan's per-block compile),
    else (or when `whole`: HF Trainer's `torch_compile=True`) the whole model."""
    found = [] if whole else blocks(model)
    for module in found or [model]:
        # Dynamo's default shapes: static at the first batch size, dynamic from the second
        # (its automatic dynamic shapes), so a sweep's probes compile twice, not once each.
        module.compile(backend=backend)
