"""The CLI: JSON shapes, one-line errors, and every option documented in the README."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from memorymark.cli import parser as cli
from memorymark.cli.parser import build_parser, main
from memorymark.settings import Settings

ROOT = Path(__file__).resolve().parents[1]


def run_cli(capsys, *argv):
    status = main(list(argv))
    out, err = capsys.readouterr()
    return status, out, err


def test_analyze_json_has_the_contract_fields(capsys):
    status, out, err = run_cli(
        capsys,
        "analyze",
        "tiny-bert",
        "--seq-len",
        "32",
        "--gpu",
        "t4",
        "--backend",
        "sim",
        "--max-batch",
        "256",
        "--json",
    )
    assert status == 0, err
    data = json.loads(out)
    assert data["model_name"] == "tiny-bert"
    assert data["device"] == data["backend"] == "sim"
    assert data["memory_source"] == "simulated"
    assert data["optimal_batch_size"] == 256 and data["capped_at_max_batch"]
    assert data["current_batch_size"] == 16
    assert data["probes"] == len(data["results"]) == 2 + 1  # 8, 16, then the cap at 256
    assert data["settings"]["gpu"] == "t4"


def test_measure_json(capsys):
    status, out, _ = run_cli(
        capsys,
        "measure",
        "tiny-gpt2",
        "--seq-len",
        "16",
        "--batch-size",
        "4",
        "--backend",
        "sim",
        "--json",
    )
    assert status == 0
    data = json.loads(out)
    assert set(data) >= {
        "batch_size",
        "success",
        "peak_bytes",
        "memory_gb",
        "breakdown",
        "step_seconds",
        "backend",
    }
    assert data["step_seconds"] is None  # simulated: no time was measured
    # Nothing limited this small step, so it never flushed: it needed what it asked for.
    assert data["demand_bytes"] == data["required_bytes"] > data["peak_bytes"]
    assert sum(data["breakdown"].values()) == data["peak_bytes"]
    assert set(data["breakdown"]) == {
        "parameters",
        "gradients",
        "optimizer_state",
        "activations",
        "logits",
        "temporary",
    }


def test_validate_backward_json(capsys):
    status, out, _ = run_cli(
        capsys,
        "validate-backward",
        "tiny-bert",
        "--seq-len",
        "32",
        "--batch-size",
        "8",
        "--backend",
        "sim",
        "--json",
    )
    assert status == 0
    data = json.loads(out)
    assert data["forward_only_bytes"] < data["forward_backward_bytes"] < data["full_step_bytes"]
    assert data["ratio"] == round(data["forward_backward_bytes"] / data["forward_only_bytes"], 3)
    assert data["verdict"] in ("PASS", "WARN", "FAIL")


def test_human_output_has_a_line_per_probe_and_the_verdict(capsys):
    status, out, _ = run_cli(
        capsys,
        "analyze",
        "tiny-bert",
        "--seq-len",
        "32",
        "--gpu",
        "a10",
        "--max-batch",
        "64",
        "--backend",
        "sim",
    )
    assert status == 0
    assert len(re.findall(r"^  batch +\d+ +(fits|OOM)", out, re.M)) == 3
    assert "optimal batch size   64" in out
    # Simulated: throughput is estimated, and the output says so (no "not measured" any more).
    assert re.search(
        r"^  throughput +[\d.]+ samples/s at batch 64, [\d.]+ at 16 .*estimated", out, re.M
    )
    assert re.search(
        r"^  speedup +[\d.]+x  \(throughput ratio, estimated; batch ratio 4.0x\)", out, re.M
    )
    assert "not measured" not in out


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["analyze", "llama-9000"], "unknown model 'llama-9000'"),
        (["analyze", "bert", "--task", "causal-lm"], "supports tasks"),
        (["analyze", "bert", "--gpu", "a1000"], "unknown GPU 'a1000'"),
        (["measure", "bert", "--batch-size", "0"], "must be at least 1"),
        (["analyze", "bert", "--seq-len", "4096"], "exceeds bert's 512 positions"),
        (["analyze", "bert", "--frobnicate"], "unrecognized arguments: --frobnicate"),
        (["analyze", "bert", "--depth", "deep"], "depth must be one of replay, trace (got 'deep')"),
    ],
)
def test_bad_input_is_one_line_and_non_zero(argv, message):
    proc = subprocess.run(
        [sys.executable, "-m", "memorymark", *argv],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
    )
    assert proc.returncode == 2
    assert message in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1
    assert "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_every_cli_option_appears_in_the_readme():
    """The README's command table names every command; docs/cli.md, the reference it links to,
    names every command and every one of its options."""
    readme = (ROOT / "README.md").read_text()
    reference = (ROOT / "docs" / "cli.md").read_text()
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    for name, command in sub.choices.items():
        assert f"`memorymark {name}" in readme, f"{name} is not in the README's command table"
        assert f"`memorymark {name}" in reference, f"{name} has no section in docs/cli.md"
        for action in command._actions:
            for flag in action.option_strings:
                if flag not in ("-h", "--help"):
                    assert flag in reference, f"{name} {flag} is not in docs/cli.md"


def test_the_readme_and_the_reference_count_the_commands_help_lists():
    parser = build_parser()
    names = list(next(a for a in parser._actions if a.dest == "command").choices)
    count = {7: "seven", 8: "eight", 9: "nine", 10: "ten"}[len(names)]
    readme = (ROOT / "README.md").read_text()
    reference = " ".join((ROOT / "docs" / "cli.md").read_text().split())
    assert f"`memorymark --help` lists {count} commands" in readme
    listed = ", ".join(f"`{n}`" for n in names[:-1]) + f" and `{names[-1]}`"
    assert f"`memorymark` has {count} commands: {listed}." in reference


@pytest.mark.parametrize(
    "settings",
    [
        Settings(model="tiny-bert"),
        Settings(model="gpt2", task="sequence-classification", seq_len=512, gpu="a10",
                 precision="bf16-mixed", optimizer="adamw-fused", grad_checkpointing=True,
                 lora_rank=8, lora_targets="c_attn", grad_accum=4, max_grad_norm=1.0,
                 margin="1GiB", target_batch=1024, current_batch=32, strategy="linear", step=4),
        Settings(model="tiny-resnet", image_size=64, gpu_memory_gib=12.5, backend="sim",
                 mode="eval", loss="logits-mean", optimizer="none", forward_only=True),
    ],
)  # fmt: skip
def test_the_command_line_of_settings_reads_back_into_the_same_settings(settings):
    import shlex

    line = settings.to_command_line()
    argv = shlex.split(line)
    assert argv[:2] == ["memorymark", "analyze"]
    assert cli.settings_from_args(cli.build_parser().parse_args(argv[1:])) == settings


def test_depth_is_a_flag_of_its_two_choices_that_reads_into_the_search_section():
    analyze = next(a for a in build_parser()._actions if a.dest == "command").choices["analyze"]
    help_text = " ".join(analyze.format_help().split())
    assert "--depth replay|trace How a simulated sweep steps a deep model: replay" in help_text
    args = build_parser().parse_args(["analyze", "tiny-bert", "--depth", "trace"])
    assert cli.settings_from_args(args).search.depth == "trace"
    default = cli.settings_from_args(build_parser().parse_args(["analyze", "tiny-bert"]))
    assert default.search.depth == "replay"


def test_every_setting_has_an_analyze_flag_whose_help_is_its_docstring():
    from memorymark.settings import FIELD_NAMES, field_help
    from memorymark.settings.codecs import flag_of

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    flags: dict = {}
    for action in sub.choices["analyze"]._actions:  # a setting's own flag comes first
        flags.setdefault(action.dest, action)  # (--grad-checkpointing sets checkpointing too)
    assert set(FIELD_NAMES) <= set(flags)
    for name in FIELD_NAMES:
        assert field_help(name), f"{name} has no docstring"
        if name != "model":
            assert flag_of(name) in flags[name].option_strings
            assert flags[name].help == field_help(name).replace("%", "%%")
    assert "Tokens per sample" in sub.choices["analyze"].format_help()
