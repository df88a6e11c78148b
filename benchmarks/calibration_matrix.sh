#!/usr/bin/env bash
# The calibration matrix behind docs/calibration: every run of `memorymark calibrate` that
# produced the committed files, in priority order, so that a short GPU lease still yields the
# most useful rows first.
#
#   bash benchmarks/calibration_matrix.sh OUT_DIR [SECONDS]
#
# Each chunk writes its own folder OUT_DIR/NN-name/ (calibrate names its files after the GPU and
# the day, so chunks must not share a folder). A chunk is cut off after its own time limit, and
# no chunk starts once SECONDS (default 540) have passed, so the run ends inside a lease's
# command limit with every finished chunk's files on disk. Logs go to OUT_DIR/NN-name.log.
#
# It re-measures what the 2026-11-23 files hold. What a lease should run first is the evidence
# the project still lacks: `make gpu-evidence` (benchmarks/gpu_evidence.py, docs/development.md
# "The evidence run").
set -u
out=${1:?usage: calibration_matrix.sh OUT_DIR [SECONDS]}
budget=${2:-540}
mkdir -p "$out"
start=$SECONDS
export PYTHONUNBUFFERED=1 TRANSFORMERS_VERBOSITY=error

chunk() {  # chunk NAME LIMIT_S ARGS...: one calibrate run, skipped when the budget is spent
  local name=$1 limit=$2
  shift 2
  if ((SECONDS - start + 20 > budget)); then
    echo "skipped $name: budget spent" | tee -a "$out/skipped.log"
    return
  fi
  echo "== $name (limit ${limit}s, at $((SECONDS - start))s)"
  timeout "$limit" python3 -m memorymark calibrate --out "$out/$name" "$@" 2>&1 |
    grep -v -e 'RuntimeWarning' -e 'return next(self.gen)' | tee "$out/$name.log"
}

# 1-3. Smaller GPUs on this one: the recommended batch must fit, the predicted maximum must
# run and one step past it must not.
chunk 01-as-a10 120 --emulate-gpu A10 --models bert gpt2 resnet \
  --precisions 32-true bf16-mixed --protocols full --batch-sizes 16
chunk 02-as-t4 80 --emulate-gpu T4 --models bert gpt2 --precisions 16-mixed \
  --protocols full --batch-sizes 16
chunk 03-as-l4 80 --emulate-gpu L4 --models gpt2 resnet --precisions bf16-mixed \
  --protocols full --batch-sizes 16
# 4. The two small LLMs at the three precisions.
chunk 04-llm 120 --models qwen2.5-0.5b llama-3.2-1b \
  --precisions 32-true bf16-mixed bf16-true --protocols full --batch-sizes 2 16
# 5. Every small catalog model at the three precisions, small and mid batches.
chunk 05-small 150 --models bert gpt2 resnet vit t5-small \
  --precisions 32-true bf16-mixed bf16-true --protocols full --batch-sizes 8 64
# 6. LoRA on both LLMs.
chunk 06-lora 100 --models qwen2.5-0.5b llama-3.2-1b --precisions bf16-true bf16-mixed \
  --lora-rank 16 --grad-checkpointing off on --protocols full --batch-sizes 8
# 7. Optimizers, checkpointing and the inference-style protocol.
chunk 07-variants 110 --models bert gpt2 resnet --precisions bf16-mixed \
  --optimizers adamw sgd --grad-checkpointing off on --protocols full inference-style \
  --batch-sizes 32
# 8. An LLM on an A100 40GB.
chunk 08-as-a100-40gb 80 --emulate-gpu "A100 40GB" --models bert qwen2.5-0.5b \
  --precisions bf16-mixed --protocols full --batch-sizes 8
echo "done at $((SECONDS - start))s"
