"""What other code prints on every command: a notice bitsandbytes logs at import, and a warning
about an op of unknown autocast policy no step calls, stay off stderr; real warnings do not."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _python(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, *args], env=env, capture_output=True, text=True, timeout=300
    )


def test_an_analysis_prints_nothing_on_stderr():
    proc = _python(
        "-m", "memorymark", "analyze", "tiny-bert", "--seq-len", "32", "--gpu", "a10",
        "--backend", "sim", "--precision", "bf16-mixed", "--max-batch", "32", "--no-save",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "optimal batch size" in proc.stdout
    assert "gemm_4bit_forward" not in proc.stderr
    assert "linalg_matrix_sqrth" not in proc.stderr
    assert proc.stderr == ""


def test_only_bitsandbytes_cpu_kernel_notice_is_dropped():
    # The notice as bitsandbytes 0.50 backends/cpu/ops.py logs it, after bitsandbytes itself is
    # imported (its logger is the one the filter was attached to before).
    code = (
        "import memorymark, bitsandbytes, logging\n"
        "log = logging.getLogger('bitsandbytes.backends.cpu.ops')\n"
        "log.warning('Failed to load CPU gemm_4bit_forward from kernels-community: %s. Please "
        "make sure you already `pip install kernels` and the kernels >= 0.11.1', 'offline')\n"
        "log.warning('a real warning of the same logger')\n"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == "a real warning of the same logger\n"


def test_an_op_of_unknown_policy_warns_once_when_a_step_calls_it():
    # linalg_matrix_exp stands in for an op a newer PyTorch autocasts on CUDA: registering it
    # warns nothing (warnings are errors here); a step that calls it is told, once.
    code = (
        "import json, warnings, torch\n"
        "warnings.simplefilter('error')\n"
        "from memorymark.cuda_rules import autocast_emulation as ae\n"
        "real = ae._registrations\n"
        "ae._registrations = lambda key: [*real(key), 'aten::linalg_matrix_exp']\n"
        "x = torch.eye(3)\n"
        "with torch.autocast('cpu', dtype=torch.bfloat16):\n"
        "    with ae.emulated() as available:\n"
        "        mm = torch.mm(x, x).dtype\n"
        "        with warnings.catch_warnings(record=True) as seen:\n"
        "            warnings.simplefilter('always')\n"
        "            out = [torch.linalg.matrix_exp(x).dtype for _ in range(2)]\n"
        "    outside = torch.linalg.matrix_exp(x).dtype\n"
        "print(json.dumps([available, str(mm), str(out[0]), str(outside),\n"
        "                  [str(w.message) for w in seen]]))\n"
    )
    proc = _python("-c", code)
    assert proc.returncode == 0, proc.stderr
    available, mm, out, outside, messages = json.loads(proc.stdout)
    assert available and mm == "torch.bfloat16"
    assert out == outside == "torch.float32"  # uncast: the input's own dtype
    assert len(messages) == 1
    assert messages[0].startswith("the step calls linalg_matrix_exp, which PyTorch")
