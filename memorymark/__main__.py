"""`python -m memorymark` and the `memorymark` console script: see memorymark/cli/parser.py.

`run()` runs the command, flushes what it printed, and leaves the process without the
interpreter's teardown: unloading torch and transformers takes about a second and does nothing
for a finished command. Output cut short by a closed pipe (`... --json | head`) ends the command
quietly, with status 1 as Python's own docs suggest for EPIPE. A Python without MemoryMark's
libraries (a system `python3` beside the project's .venv) gets one line saying how to install
them, not an import traceback. Tests call `cli.main()` instead, which returns the status and
leaves the process alone.
Must not know any command's work: that is memorymark/cli/parser.py's and
memorymark/cli/commands.py's.
"""

from __future__ import annotations

import os
import sys

REQUIRED = ("torch", "transformers", "peft", "bitsandbytes", "pandas", "plotly")
"""The libraries a command may import (requirements.txt): one missing means an install step."""


def run() -> None:
    """Run one command from `sys.argv` and exit with its status, skipping teardown."""
    try:
        from memorymark.cli.parser import main

        status = main()
        sys.stdout.flush()
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] not in REQUIRED:
            raise
        status = _not_installed(exc.name or "")
    except SystemExit as exc:  # argparse: --help, --version, a usage error
        status = _exit_status(exc.code)
        sys.stdout.flush()
    except BrokenPipeError:
        status = _closed_pipe()
    try:
        sys.stderr.flush()
    except BrokenPipeError:
        pass
    os._exit(status)


def _exit_status(code: object) -> int:
    """The status `sys.exit(code)` would give: None is 0, a message is printed and is 1."""
    if code is None or isinstance(code, int):
        return code or 0
    print(code, file=sys.stderr)
    return 1


def _not_installed(module: str) -> int:
    print(
        f"memorymark: {module} is not installed for {sys.executable}. Run `make run` once in "
        "the checkout and use .venv/bin/memorymark, or `pip install -r requirements.txt` into "
        "this Python (README, Quick start).",
        file=sys.stderr,
    )
    return 2


def _closed_pipe() -> int:
    # The reader went away: what is still buffered can never be written. Point stdout at
    # /dev/null so nothing flushes into the closed pipe again (docs.python.org, "Note on SIGPIPE").
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 1


if __name__ == "__main__":
    run()
