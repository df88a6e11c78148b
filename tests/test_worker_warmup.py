"""The forkserver's warm-up leaves forking safe on the torch installed, and the pool survives a
preload that does not: the app's analyses ran in workers forked after autograd had started its
device threads, and every one failed (torch 2.14.1+cu130)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memorymark.service import executors, questions
from memorymark.service.worker_pool import FORKED_AUTOGRAD, WorkerPool

ROOT = Path(__file__).resolve().parent.parent
FORKED_MARK = "MEMORYMARK_TEST_FORKED_FROM_PRELOAD"


def test_the_warm_up_starts_no_thread_and_a_forked_worker_trains() -> None:
    # A fresh interpreter, as the forkserver is: the warm-up's thread count before and after,
    # then a forked child runs the first backward of its life and a simulated training step.
    script = textwrap.dedent(
        """
        import os
        def threads():
            return len(os.listdir("/proc/self/task"))
        import memorymark.service.jobs
        before = threads()
        import memorymark.service.warmup
        after = threads()
        pid = os.fork()
        if pid == 0:
            from memorymark.engine import Session
            from memorymark.service import questions
            from memorymark.settings import Settings
            questions.autograd_runs()
            m = Session(Settings(model="tiny-gpt2", seq_len=16, gpu="a10")).measure(2)
            os._exit(0 if m.fits and m.error is None else 3)
        _, status = os.waitpid(pid, 0)
        print(before, after, os.waitstatus_to_exitcode(status))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, child = done.stdout.split()[-3:]
    assert after == before, f"the warm-up started {int(after) - int(before)} threads"
    assert child == "0"


def test_the_ready_check_runs_a_backward_in_the_worker() -> None:
    questions.autograd_runs()  # the suite's own process forks nothing: it must simply pass


def refuse_when_forked() -> None:
    """A ready check that fails, as a poisoned fork does, in workers forked from the preload."""
    if os.environ.get(FORKED_MARK):
        raise RuntimeError(f"Unable to handle {FORKED_AUTOGRAD}.")


def whoami() -> str:
    return "forked" if os.environ.get(FORKED_MARK) else "spawned"


@pytest.mark.skipif(sys.platform != "linux", reason="the forkserver start method")
def test_a_pool_whose_forks_cannot_run_autograd_moves_to_spawned_workers() -> None:
    pool = WorkerPool(
        1, preload=("tests.fork_marker",), start_method="forkserver", ready_check=refuse_when_forked
    )
    try:
        assert pool.submit(whoami).result(timeout=120) == "spawned"
        assert pool.submit(whoami).result(timeout=120) == "spawned"
    finally:
        pool.shutdown()


def test_the_app_pools_check_each_worker() -> None:
    service = executors.local_service(1, preload=False)
    try:
        assert service.executor._ready_check is questions.autograd_runs
        assert service._question_executor._ready_check is questions.autograd_runs
    finally:
        service.shutdown()
