"""Distributed: many GPUs in numbers: strategies, GPU counts, NCCL's memory, traffic.

Owns the topology arithmetic every many-GPU path shares. Must not know: torch, how a rank is
simulated or measured (memorymark/backends/), or how anything is shown.
"""
