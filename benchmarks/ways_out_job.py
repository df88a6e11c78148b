"""Time an analysis where nothing fits through the app's job path, and when each way out lands.

Runs what a click on Analyze runs: the server's ceilings (ServerConfig from the environment,
as the app reads them), a sweep job on the server's worker pool, polled as the page polls it.
Prints, with the seconds since the click: each state the job enters, each way out the moment it
arrives (with whether it fits), and at the end what the page shows: the sweep's verdict, and
the ways out's stop, if any, in the report's words. Issue 29's case by default:

    python benchmarks/ways_out_job.py                      # Llama-3.1-70B on an A10
    python benchmarks/ways_out_job.py --model tiny-bert --gpu-memory 1

No figure here is a memory measurement: the times are wall seconds on the machine that runs it
(say how loaded it was: `uptime`).
"""

from __future__ import annotations

import argparse
import time

from memorymark.service.executors import service_for
from memorymark.service.jobs import SweepRequest
from memorymark.service.server_config import ServerConfig
from memorymark.settings import Settings


def main() -> None:
    """Run one job and print its timeline."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="llama-3.1-70b")
    parser.add_argument("--gpu", default="a10")
    parser.add_argument("--gpu-memory", type=float, default=None, help="a custom GPU's GiB")
    args = parser.parse_args()
    gpu = None if args.gpu_memory else args.gpu
    settings = Settings(model=args.model, gpu=gpu, gpu_memory_gib=args.gpu_memory)
    config = ServerConfig.from_sources()
    run_as, _ = config.apply(settings)
    print(
        f"ceilings: sweep {config.max_time_limit:g} s, ways out "
        f"{config.max_ways_out_time_limit:g} s; workers {config.workers or 'one per core'}"
    )
    service = service_for(config)
    began = time.perf_counter()
    service.local_gpus()  # the first page waits for a worker, as a served app does
    print(f"workers ready after {time.perf_counter() - began:.1f} s")
    click = time.perf_counter()
    job = service.submit(SweepRequest(settings, run_as=run_as))
    state, probes, fixes = None, 0, 0
    while job.running:
        time.sleep(0.5)
        job.poll()
        at = time.perf_counter() - click
        if job.state != state:
            state = job.state
            print(f"{at:7.1f} s  state {state}")
        for m in job.measurements[probes:]:
            print(f"{at:7.1f} s  probe batch {m.batch_size}: {'fits' if m.fits else 'OOM'}")
        probes = len(job.measurements)
        for fix in job.fixes[fixes:]:
            print(f"{at:7.1f} s  way out: {fix.title} ({'fits' if fix.fits else 'too big'})")
        fixes = len(job.fixes)
    total = time.perf_counter() - click
    report = job.report
    print(f"{total:7.1f} s  {job.state}" + (f": {job.error}" if job.error else ""))
    if report is not None:
        print(f"verdict: {report.verdict()}")
        print(f"sweep stopped by: {report.stopped_by}; ways out: {len(report.fixes)}")
        for fix in report.fixes:
            print(f"  {fix.title}: {'fits' if fix.fits else 'too big'}")
        if report.ways_out_note:
            print(report.ways_out_note)
    service.shutdown()


if __name__ == "__main__":
    main()
