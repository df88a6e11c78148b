"""Accounting: from a step's tensors to bytes, a peak, and seconds.

Owns the tracker (every live storage's bytes while a step runs, by category), the model of
PyTorch's CUDA caching allocator that replays those allocations against a capacity, and the
throughput estimate (FLOPs and bytes against a GPU's peak rates), and the symbolic step: those
figures as polynomials of the batch, read off traced steps, for the symbolic sweep to replay.

Must not know: which backend ran the step, which batch sizes are tried, or how anything is shown.
"""
