"""The command line: `python -m memorymark` and the `memorymark` console script.

Owns parsing (`parser`), what each command does with the engine and how it prints (`commands`),
and `memorymark history ...` (`history`). A thin layer: every figure comes from the engine, and a
library error becomes one line on stderr with a non-zero exit status.

Must not know: Streamlit.
"""
