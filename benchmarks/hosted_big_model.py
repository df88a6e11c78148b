"""Time a big model's analysis in the app, in a browser, under the hosted app's ceilings.

Serves `streamlit run app.py` with the server's default ceilings (MEMORYMARK_MAX_TIME_LIMIT and
MEMORYMARK_MAX_WAYS_OUT_TIME_LIMIT: 300 s each, as a hosted app runs), warms it with one tiny
analysis, then opens the big case in headless Chromium (Playwright, Debian's chromium), clicks
Analyze and prints, in seconds from the click:
- the sweep's verdict on the page ("What would make it fit" when nothing fits, or "Optimal
  batch size");
- the end of the whole job ("Done (" on the progress bar: the ways out included);
and whether the page says a ceiling stopped anything. Issue 31's case by default:

    python benchmarks/hosted_big_model.py                       # Llama-3.1-70B on an A10
    python benchmarks/hosted_big_model.py --query "model=llama-3.1-70b&gpu=H100&dist=fsdp&gpus=auto"

The times are wall seconds on the machine that runs it, not memory figures (say how loaded it
was: `uptime`).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from app_load import CHROMIUM, CHROMIUM_ARGS, analyze_in_page, serving

HOSTED_CEILING_S = 300
"""The hosted app's job ceiling (memorymark/service/server_config.py's defaults)."""


def main() -> None:
    """Serve the app, time the case in a browser, print the timeline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--query", default="model=llama-3.1-70b&gpu=A10")
    args = parser.parse_args()
    from playwright.sync_api import expect, sync_playwright

    ceilings = {
        "MEMORYMARK_MAX_TIME_LIMIT": str(HOSTED_CEILING_S),
        "MEMORYMARK_MAX_WAYS_OUT_TIME_LIMIT": str(HOSTED_CEILING_S),
    }
    with serving(None, env=ceilings) as (_, url), sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000})
            warm = analyze_in_page(page, url, "model=tiny-bert&max_batch=64")
            load = os.getloadavg()[0]
            print(f"cpu cores {os.cpu_count()}, load {load:.2f}; warm-up {warm:.1f} s")
            page.goto(f"{url}/?{args.query}", timeout=120_000)
            analyze = page.get_by_role("button", name="Analyze")
            analyze.wait_for(timeout=120_000)
            click = time.perf_counter()
            analyze.click()
            verdict = page.get_by_text("What would make it fit").or_(
                page.get_by_text("Optimal batch size")
            )
            expect(verdict.first).to_be_visible(timeout=2 * HOSTED_CEILING_S * 1000)
            print(f"{time.perf_counter() - click:7.1f} s  the sweep's verdict is on the page")
            done = page.get_by_text("Done (")
            expect(done.first).to_be_visible(timeout=2 * HOSTED_CEILING_S * 1000)
            took = time.perf_counter() - click
            print(f"{took:7.1f} s  done: {done.first.inner_text()}")
            stopped = page.get_by_text("the search stopped at")
            if stopped.count():
                print(f"          a ceiling stopped the ways out: {stopped.first.inner_text()}")
            ways = page.get_by_role("button", name="Apply and analyze").count()
            print(f"ways out on the page: {ways}; {took / HOSTED_CEILING_S:.0%} of the "
                  f"{HOSTED_CEILING_S} s ceiling")  # fmt: skip
        finally:
            browser.close()


if __name__ == "__main__":
    main()
