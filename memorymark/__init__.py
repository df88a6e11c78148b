"""MemoryMark: the largest batch size that really trains, measured or simulated.

The public API: `Settings` and `Costs` say what to analyse, `analyze()` streams the sweep and
`Report` does the arithmetic. The engine never imports Streamlit.
"""

__version__ = "0.1.0"
