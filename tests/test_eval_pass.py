"""The evaluation pass in the loop judged: HF Trainer's evaluation between training steps, its
predictions kept on the GPU beside the training state, the largest eval batch that fits, and
where the answer shows (JSON, text, CLI flags, the hf snippet, history)."""

import json
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import transformers

from memorymark import Session, Settings
from memorymark.backends.device import DeviceBackend
from memorymark.cli.parser import main
from memorymark.fit import FitPolicy
from memorymark.reporting.json_form import report_to_dict
from memorymark.reporting.record import record_to_report, report_to_record
from memorymark.reporting.snippets import snippet
from memorymark.search.plan import TrainingPlan
from memorymark.step import user_job
from memorymark.step.catalog import CatalogStep
from memorymark.units import MIB

# A 2-layer GPT-2 (vocabulary 1000) at 64 tokens on a 1 GiB GPU (0.61 GiB usable): one eval
# batch of 256 keeps 256 x 64 x 1000 fp32 logits, 62.5 MiB, on the GPU.
TINY = Settings(model="tiny-gpt2", seq_len=64, gpu_memory_gib=1)
LOGITS_BYTES = 256 * 64 * 1000 * 4


def eval_measure(batch_size: int, **evaluation) -> object:
    return Session(replace(TINY, **evaluation)).measure(batch_size)


def test_an_eval_batch_that_trains_but_keeps_its_predictions_makes_the_loop_not_fit():
    assert Session(TINY).measure(256).fits  # 256 trains...
    one = eval_measure(8, eval_batch=256)  # ...and evaluates with one batch's predictions kept
    assert one.fits and one.eval_peak_bytes > LOGITS_BYTES
    # Six batches' predictions on the GPU: the last concatenation holds twelve batches' logits.
    kept = eval_measure(8, eval_batch=256, eval_accumulation=6)
    assert not kept.runs and not kept.fits
    assert kept.error.startswith("simulated out of memory: needs")
    assert kept.eval_peak_bytes > 12 * LOGITS_BYTES
    # The training step's own figures stay the step's.
    assert kept.peak_bytes == one.peak_bytes == Session(TINY).measure(8).peak_bytes


def test_fewer_eval_batches_kept_on_the_gpu_lower_the_eval_peak():
    peaks = {
        k: eval_measure(8, eval_batch=256, eval_accumulation=k).eval_peak_bytes for k in (1, 2, 4)
    }
    # Unset is one batch, as eval_accumulation_steps=1 keeps it.
    assert eval_measure(8, eval_batch=256).eval_peak_bytes == peaks[1]
    # At the K-th batch, torch.cat holds the K-1 kept, the new one and the K concatenated.
    assert peaks[1] < peaks[2] < peaks[4]
    assert peaks[4] - peaks[2] == pytest.approx(4 * LOGITS_BYTES, rel=0.01)
    assert peaks[2] - peaks[1] > 1.9 * LOGITS_BYTES


def test_run_eval_keeps_trainer_s_predictions_and_trains_again_after():
    step = CatalogStep(TINY.replace(eval_batch=2, eval_accumulation=3))
    model = step.build_model()
    seen = []
    original = torch.cat

    def cat(tensors, dim=0):
        seen.append(tuple(t.shape[0] for t in tensors))
        return original(tensors, dim=dim)

    torch.cat = cat
    try:
        step.run_eval(model, 2, "cpu")
    finally:
        torch.cat = original
    assert model.training  # back to training mode, as the next step needs it
    # Losses (repeated over the batch), logits and labels, each concatenated per batch.
    assert sorted(seen) == sorted([(2, 2), (4, 2)] * 3)


def test_the_largest_eval_batch_is_searched_at_the_recommended_batch():
    session = Session(TINY.replace(eval_batch=64, max_batch=512))
    report = session.analyze(plan=False)
    answer = report.evaluation
    assert answer.at_batch == report.optimal.batch_size
    assert answer.fits and answer.batch == 64 and answer.kept_batches == 1
    best = answer.max_eval_batch
    assert best >= 64
    probes = dict(answer.probes)
    assert probes[best].fits
    # The next eval batch of the grid was measured and does not fit.
    assert not probes[best + TINY.search.step].fits
    assert all(m.fits == (n <= best) for n, m in answer.probes)
    # The sweep's own verdicts already include the pass: the optimal loop fits with it.
    assert report.optimal.eval_peak_bytes == answer.peak_bytes

    data = report_to_dict(report)["eval"]
    assert {k: data[k] for k in ("batch", "accumulation", "fits", "max_eval_batch")} == {
        "batch": 64,
        "accumulation": 1,
        "fits": True,
        "max_eval_batch": best,
    }
    assert data["peak_gb"] == round(answer.peak_bytes / 2**30, 3)
    assert data["at_batch"] == report.optimal.batch_size
    assert "eval_accumulation_steps unset" in data["note"]
    # History reopens the same answer.
    back = record_to_report(json.loads(json.dumps(report_to_record(report))))
    assert report_to_dict(back)["eval"] == data


def test_no_eval_pass_no_eval_block():
    report = Session(TINY.replace(max_batch=16)).analyze(plan=False)
    assert report.evaluation is None and report_to_dict(report)["eval"] is None
    assert all(m.eval_peak_bytes is None for m in report.measurements)


def test_cli_flags_measure_and_report_the_eval_pass(capsys):
    status = main(
        ["measure", "tiny-gpt2", "--seq-len", "64", "--gpu-memory", "1", "--batch-size", "8",
         "--eval-batch", "256", "--eval-accumulation", "2", "--json"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    data = json.loads(out)
    assert data["eval_peak_bytes"] > 4 * LOGITS_BYTES and data["success"]
    status = main(
        ["analyze", "tiny-gpt2", "--seq-len", "64", "--gpu-memory", "1", "--max-batch", "64",
         "--eval-batch", "256", "--eval-accumulation", "2", "--no-save"]
    )  # fmt: skip
    out, err = capsys.readouterr()
    assert status == 0, err
    assert "Evaluation at eval batch 256 (2 batches of predictions kept, peak" in out
    assert "the largest eval batch that fits is" in out


def test_eval_accumulation_needs_an_eval_batch(capsys):
    with pytest.raises(ValueError, match="eval_accumulation needs an evaluation pass"):
        Settings(eval_accumulation=4)
    assert main(["measure", "tiny-gpt2", "--batch-size", "1", "--eval-accumulation", "2"]) == 2
    assert "--eval-batch" in capsys.readouterr().err


def test_a_training_job_evaluates_in_its_own_code():
    with pytest.raises(ValueError, match="--eval-batch describes the model or its step"):
        user_job.check_settings(Settings(eval_batch=8))


def test_the_hf_snippet_sets_the_eval_batch_and_its_accumulation(monkeypatch, tmp_path):
    plan = TrainingPlan(micro_batch=8, accumulation_steps=1, target_batch=None)
    monkeypatch.chdir(tmp_path)
    for evaluation, kept in (
        ({"eval_batch": 64}, 1),
        ({"eval_batch": 64, "eval_accumulation": 5}, 5),
    ):
        code = snippet("hf", Settings(**evaluation), plan)
        args_code = code[code.index("args = ") : code.index("\ntrainer = ")]
        namespace = {"TrainingArguments": transformers.TrainingArguments}
        exec(compile(args_code, "<snippet>", "exec"), namespace)
        args = namespace["args"]
        assert (args.per_device_eval_batch_size, args.eval_accumulation_steps) == (64, kept)
    assert "per_device_eval_batch_size" not in snippet("hf", Settings(), plan)


class PhasedCuda(SimpleNamespace):
    """torch.cuda's memory API on CPU, its peaks those of the stretch since the last reset: the
    step's first, then the evaluation pass's."""

    def __init__(self):
        super().__init__(calls=[], peaks=[(1000, 4096), (3000, 8192)], resets=0)

    def reset_peak_memory_stats(self):
        self.resets += 1
        self.calls.append("reset")

    def _peak(self):
        return self.peaks[min(self.resets, len(self.peaks)) - 1]

    def max_memory_allocated(self):
        return self._peak()[0]

    def max_memory_reserved(self):
        return self._peak()[1]

    def memory_stats(self):
        return {"num_alloc_retries": 0, "num_ooms": 0}

    def synchronize(self):
        self.calls.append("sync")

    def empty_cache(self):
        self.calls.append("empty_cache")


def test_a_real_device_reads_its_peak_around_the_eval_pass():
    cuda = PhasedCuda()
    step = CatalogStep(Settings(model="tiny-bert", seq_len=8, eval_batch=4))
    backend = DeviceBackend(
        step, policy=FitPolicy(capacity_bytes=10**12), name="cpu", device_module=cuda,
        peak_stats=True, timed_steps=1,
    )  # fmt: skip
    m = backend.measure(2)
    assert (m.peak_bytes, m.eval_peak_bytes) == (1000, 3000)  # the step's, the pass's
    assert m.reserved_bytes == m.required_bytes == 8192  # the loop's: the larger
    assert cuda.calls[:4] == ["empty_cache", "reset", "sync", "reset"]
    # Tighter than the pass: the loop does not fit, though the step alone would.
    backend.policy = FitPolicy(capacity_bytes=6000)
    cuda.resets = 0
    assert not backend.measure(2).runs


def test_one_eval_batch_holds_its_logits_and_their_loss_copies():
    # The eval pass of one batch holds its logits and their loss's fp32 copies: about two
    # batches of logits, the 2-layer model's weights and AdamW state being a few MiB.
    m = eval_measure(8, eval_batch=256)
    assert 2 * LOGITS_BYTES < m.eval_peak_bytes < 2 * LOGITS_BYTES + 8 * MIB


def test_when_evaluation_is_what_does_not_fit_the_answer_says_which_eval_batch_would():
    settings = TINY.replace(max_batch=64, eval_batch=256, eval_accumulation=6)
    report = Session(settings).analyze(fixes=False, plan=False)
    assert report.optimal is None
    assert "evaluating at eval batch 256 between steps" in report.verdict()
    answer = report.evaluation
    assert (answer.at_batch, answer.fits) == (1, False)
    # Six batches' predictions of 64 samples fit beside batch 1; of 256, they do not.
    assert 0 < answer.max_eval_batch < 256
    assert dict(answer.probes)[answer.max_eval_batch].fits
