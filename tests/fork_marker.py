"""Preloaded by a test's forkserver (tests/test_worker_warmup.py): marks every process forked
from it, as a preload that started autograd's threads would poison them."""

import os

os.environ["MEMORYMARK_TEST_FORKED_FROM_PRELOAD"] = "1"
