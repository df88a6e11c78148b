"""Distributed: many GPUs in numbers: strategies, the GPU counts a cluster offers, NCCL's
memory, traffic, the parallel layout (`layout`) and the layouts a search tries with what each
costs beyond the step (`layout_costs`: the pipeline bubble, TP, CP and PP traffic).

Owns the topology arithmetic every many-GPU path shares (settings validate against it, so it sits
below them). Must not know: torch, settings, how a rank is simulated or measured
(memorymark/backends/), how a GPU count is searched (memorymark/search/gpu_count.py), or how
anything is shown.
"""
