"""The chunks of the real-GPU evidence run (benchmarks/gpu_evidence.py drives them).

`plan` says what each chunk measures on a GPU lease and dry on CPU; `device` is where steps run
(the CUDA GPU, or its dry stand-in); `calibrated` holds the chunks made of calibration rows (the
smoke test, the capped-capacity question, QLoRA and the bitsandbytes optimizers), `loops` the long
loops with evaluation, `peers` Lightning's and Accelerate's batch finders. Each chunk takes
(device, plan, folder, day), writes its files there as it finishes, and returns what it did.
They compose the engine's public pieces and know nothing of the driver's time limits.
"""
