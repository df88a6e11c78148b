"""The hosted app's entrypoint: MemoryMark with `MEMORYMARK_HOSTED=true`, for a URL shared with
strangers.

Streamlit Community Cloud deploys it as the app's main file (README, "Host it"): it installs
hosted/requirements.txt (CPU torch) because that file lies beside this one, and it runs from the
repository's root, so `.streamlit/config.toml` applies. Everything else is the app itself: this
file only turns the hosted switch on, unless the server's environment already set it, and runs
app.py, whose pages are found from app.py's own folder.
"""

from __future__ import annotations

import os
import runpy
import sys
from pathlib import Path

# The repository's root, where app.py and the `memorymark` package are. (A string here would be
# drawn on the page: Streamlit's magic writes every bare expression of the main script.)
ROOT = Path(__file__).resolve().parent.parent

os.environ.setdefault("MEMORYMARK_HOSTED", "true")
if str(ROOT) not in sys.path:  # Streamlit puts this file's folder on the path, not the root
    sys.path.insert(0, str(ROOT))
runpy.run_path(str(ROOT / "app.py"), run_name="__main__")
