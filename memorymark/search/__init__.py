"""Search: which batch sizes (or sequence lengths) to try, and the generator that tries them.

Owns `sweep` (yields each measurement the moment it lands), the strategies it asks (`symbolic`,
the default, and `fast` and `linear`) and the factory that picks one (`pick`), the
longest-sequence search (`seq_len`), the smallest GPU count that trains batch 1 (`gpu_count`),
how long a sweep will take (`estimate`), the plan from the batch that fits to the global
batch a user wants (`plan`), the evaluation pass's answer (`eval_batch`), and a compiled step's
sweep beside its eager twin's (`compile_gap`).

Must not know: how a measurement is taken (any backend will do), torch, or how anything is shown.
"""
