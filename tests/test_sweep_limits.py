"""Limits on every sweep: time and probes end it with a partial answer; the server's ceilings
(environment or secrets) hold against any link; slow configs are refused up front."""

from __future__ import annotations

import json
import time

import pytest
from app_helpers import app

from memorymark.cli.parser import main
from memorymark.engine import Session
from memorymark.reporting.json_form import report_to_dict
from memorymark.search import estimate
from memorymark.search.strategies import LinearStrategy
from memorymark.search.sweep import SweepLimits, sweep
from memorymark.service.server_config import ServerConfig
from memorymark.settings import Settings
from memorymark.ui import sweep_runner


def linear(function_backend, limits: SweepLimits, seconds: float = 0.0):
    class Slow(function_backend):
        def measure(self, batch_size):
            time.sleep(seconds)
            return super().measure(batch_size)

    backend = Slow(lambda b: (100 * b,), 10**9)
    strategy = LinearStrategy(step=8, max_batch=4096, capacity_bytes=10**9)
    return [m.batch_size for m in sweep(backend, strategy, also=(16,), limits=limits)], backend


def test_the_probe_limit_ends_the_sweep_and_says_so(function_backend) -> None:
    limits = SweepLimits(max_probes=3)
    tried, backend = linear(function_backend, limits)
    assert tried == [8, 16, 24]
    assert limits.stopped_by == "the probe limit (3 probes)" and backend.released


def test_the_time_limit_stops_before_a_probe_that_would_pass_it(function_backend) -> None:
    limits = SweepLimits(time_limit_seconds=0.35)
    tried, _ = linear(function_backend, limits, seconds=0.1)
    # 0.1 s a probe: a fourth would end at 0.4 s, past the limit, so it is not started.
    assert tried == [8, 16, 24]
    assert limits.stopped_by == "the time limit (0.35 s)"


def test_a_sweep_within_its_limits_is_not_partial(function_backend) -> None:
    limits = SweepLimits(max_probes=1000)
    function_backend_fits = function_backend
    backend = function_backend_fits(lambda b: (100 * b,), 1000 * 8 + 1)
    strategy = LinearStrategy(step=8, max_batch=4096, capacity_bytes=1000 * 8 + 1)
    list(sweep(backend, strategy, limits=limits))
    assert limits.stopped_by is None


def test_a_limited_session_reports_a_partial_answer_and_measures_nothing_more(tiny_bert) -> None:
    settings = Settings(**{**tiny_bert.to_dict(), "max_probes": 2, "target_batch": 64})
    report = Session(settings).analyze()
    assert len(report.measurements) == 2 and report.stopped_by == "the probe limit (2 probes)"
    assert report.partial_note.startswith("Partial answer: the sweep stopped at the probe limit")
    assert report.plan is None and report.plan_probes == ()  # no plan steps past the limit
    data = report_to_dict(report)
    assert data["stopped_by"] == report.stopped_by and data["partial_note"] == report.partial_note


def test_the_cli_takes_both_limits_and_prints_the_partial_answer(capsys) -> None:
    assert main(["analyze", "tiny-bert", "--seq-len", "16", "--gpu", "a10", "--max-probes", "1",
                 "--time-limit", "600", "--json"]) == 0  # fmt: skip
    data = json.loads(capsys.readouterr().out)
    assert data["probes"] == 1 and data["stopped_by"] == "the probe limit (1 probes)"
    assert data["settings"]["time_limit_seconds"] == 600.0


@pytest.mark.parametrize("flags", [["--time-limit", "nan"], ["--time-limit", "0"],
                                   ["--max-probes", "0"], ["--time-limit", "1e400"]])  # fmt: skip
def test_a_bad_limit_is_one_line_and_exit_status_2(flags, capsys) -> None:
    try:
        status = main(["analyze", "tiny-bert", *flags])
    except SystemExit as exc:  # argparse's own refusal
        status = exc.code
    assert status == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err


def test_the_limits_round_trip_through_the_command_line_and_the_link() -> None:
    s = Settings(model="bert", time_limit_seconds=30.0, max_probes=5)
    assert "--time-limit 30.0 --max-probes 5" in s.to_command_line()
    assert Settings.from_query(s.to_query()) == s


def test_a_config_too_slow_for_the_time_limit_is_refused_before_any_probe() -> None:
    settings = Settings(model="llama-3.1-70b", gpu="a10", time_limit_seconds=2)
    with pytest.raises(ValueError, match=r"Llama-3.1-70B \(80 layers\) would take about \d+ s"):
        next(Session(settings).stream())
    # The depth replay traces 2-5 of its 80 blocks at the first probe, 3 and 4 after.
    llama = {"num_hidden_layers": 80}
    replayed = estimate.sweep_seconds(llama, 2, 3, replay_depth=True)
    assert replayed < estimate.sweep_seconds(llama, 2, 3) / 4
    # The estimate grows with layers and labels, not with widths (fake tensors do no arithmetic).
    small, deep = {"num_hidden_layers": 2}, {"num_hidden_layers": 200}
    assert estimate.sweep_seconds(deep, 2, 3) > 50 * estimate.sweep_seconds(small, 2, 3)
    assert estimate.layer_count({"encoder_layers": 6, "decoder_layers": 6}) == 12


def test_the_server_reads_its_ceilings_from_the_environment_before_secrets() -> None:
    env = {"MEMORYMARK_MAX_PROBES": "12", "MEMORYMARK_ALLOW_CPU_BACKEND": "yes"}
    secrets = {
        "MEMORYMARK_MAX_PROBES": "99",
        "MEMORYMARK_MAX_TIME_LIMIT": "60",
        "MEMORYMARK_WORKER_MEMORY_GIB": "0",
        "MEMORYMARK_DASK_SCHEDULER": "tcp://x:8786",
    }
    config = ServerConfig.from_sources(env, secrets)
    assert (config.max_probes, config.max_time_limit, config.allow_cpu_backend) == (12, 60.0, True)
    assert config.worker_memory_bytes is None and config.dask_scheduler == "tcp://x:8786"
    with pytest.raises(ValueError, match="MEMORYMARK_MAX_BATCH has a bad value"):
        ServerConfig.from_sources({"MEMORYMARK_MAX_BATCH": "nan"})


def test_the_ceilings_bring_a_sweep_down_and_keep_the_cpu_backend_off() -> None:
    server = ServerConfig(max_time_limit=60, max_probes=10, max_batch=512)
    asked = Settings.from_query({"time_limit_seconds": "86400", "max_probes": "100000",
                                 "max_batch": "1048576"})  # fmt: skip
    applied, notes = server.apply(asked)
    assert (
        applied.search.time_limit_seconds,
        applied.search.max_probes,
        applied.search.max_batch,
    ) == (60, 10, 512)
    assert len(notes) == 3
    unlimited, _ = server.apply(Settings())  # no limit asked: the server's
    assert (unlimited.search.time_limit_seconds, unlimited.search.max_probes) == (60, 10)
    with pytest.raises(ValueError, match="cpu backend .* is off on this server"):
        server.apply(Settings(backend="cpu"))
    assert (
        ServerConfig(allow_cpu_backend=True).apply(Settings(backend="cpu"))[0].hardware.backend
        == "cpu"
    )


def test_the_ways_out_have_a_ceiling_of_their_own_apart_from_the_sweep_s() -> None:
    config = ServerConfig.from_sources({"MEMORYMARK_MAX_WAYS_OUT_TIME_LIMIT": "120"})
    assert (config.max_time_limit, config.max_ways_out_time_limit) == (300, 120)
    applied, notes = config.apply(Settings(ways_out_time_limit_seconds=600))
    assert (applied.search.time_limit_seconds, applied.search.ways_out_time_limit_seconds) == (
        300,
        120,
    )
    assert notes == ["ways_out_time_limit_seconds 600 s is above this server's 120 s"]
    assert (
        ServerConfig().apply(Settings())[0].search.ways_out_time_limit_seconds == 300
    )  # the default
    with pytest.raises(ValueError, match="MEMORYMARK_MAX_WAYS_OUT_TIME_LIMIT has a bad value"):
        ServerConfig.from_sources({"MEMORYMARK_MAX_WAYS_OUT_TIME_LIMIT": "-1"})


def test_a_link_cannot_raise_the_app_ceilings(fake, fresh_caches, monkeypatch) -> None:
    server = ServerConfig(max_time_limit=30, max_probes=4)
    monkeypatch.setattr(sweep_runner, "server_config", lambda: server)
    at = app(model="tiny-bert", max_probes="100000", time_limit_seconds="86400")
    at.button(key="analyze").click().run()
    job = at.session_state[sweep_runner.JOB_KEY]
    assert (job.run_as.search.max_probes, job.run_as.search.time_limit_seconds) == (4, 30)
    assert any("above this server" in c.value and "4 probes" in c.value for c in at.caption)
    assert not at.exception


def test_the_ceilings_run_but_are_not_written_into_links_or_commands(
    fake, fresh_caches, monkeypatch
) -> None:
    server = ServerConfig(max_time_limit=30, max_probes=4)
    monkeypatch.setattr(sweep_runner, "server_config", lambda: server)
    at = app(model="tiny-bert")
    at.button(key="analyze").click().run()
    job = at.session_state[sweep_runner.JOB_KEY]
    assert (job.run_as.search.max_probes, job.run_as.search.time_limit_seconds) == (4, 30)
    assert job.report is not None and job.report.settings == job.settings
    command = job.report.settings.to_command_line()
    assert "--time-limit" not in command and "--max-probes" not in command
    assert "time_limit_seconds" not in at.query_params and "max_probes" not in at.query_params
    shown = [e.value for kind in ("caption", "code", "markdown") for e in at.get(kind)]
    assert any("memorymark analyze" in text for text in shown)  # the log's `$` line
    assert not any("--max-probes" in text for text in shown)


def test_a_hosted_server_turns_off_what_strangers_must_not_reach() -> None:
    config = ServerConfig.from_sources(
        {"MEMORYMARK_ALLOW_CPU_BACKEND": "true"}, {"MEMORYMARK_HOSTED": True}
    )
    assert config.hosted and not config.allow_cpu_backend and config.workers == 1
    assert config.worker_memory_gib == 2.0  # a free host's memory, unless the owner says more
    owner = ServerConfig.from_sources(
        {"MEMORYMARK_HOSTED": "1", "MEMORYMARK_WORKER_MEMORY_GIB": "6"}
    )
    assert owner.worker_memory_gib == 6.0
    with pytest.raises(ValueError, match="cpu backend"):
        config.apply(Settings(backend="cpu"))
    owned = ServerConfig.from_sources({"MEMORYMARK_HOSTED": "1", "MEMORYMARK_WORKERS": "3"})
    assert owned.workers == 3  # the owner's count wins
    assert ServerConfig().workers is None and not ServerConfig().hosted


def test_the_app_refuses_the_cpu_backend_unless_the_server_allows_it(fresh_caches, monkeypatch):
    monkeypatch.setattr(sweep_runner, "server_config", lambda: ServerConfig())
    at = app(model="tiny-bert", backend="cpu")
    assert "cpu backend" in at.error[0].value and not at.exception
    assert not [b for b in at.button if b.key == "analyze"]


def test_the_cli_refuses_a_config_too_slow_for_its_time_limit_in_one_line(capsys) -> None:
    assert main(["analyze", "llama-3.1-70b", "--gpu", "a10", "--time-limit", "2"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "would take about" in err and "more than the time limit of 2 s" in err
