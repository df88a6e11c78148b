"""Hostile config files, paths and model names: refused in one line, without reading past a cap."""

import json
import os
import re
import threading

import pytest
from config_samples import TINY_BERT

from memorymark import models
from memorymark.cli import parser
from memorymark.models import config_checks, sources
from memorymark.settings import Settings, check_model

pytestmark = pytest.mark.usefixtures("any_config_path")


def refusal(spec):
    """The one-line message `spec` is refused with, where the model is resolved (the Session
    and the app's sidebar call `check_model`; Settings read nothing)."""
    with pytest.raises(ValueError) as info:
        check_model(Settings(model=spec))
    message = str(info.value)
    assert "\n" not in message and len(message) < 300
    return message


def config(tmp_path, data, name="config.json"):
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return f"file:{path}"


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ({"model_type": ["bert"]}, "model_type must be a name .got list"),
        ({"architectures": 5}, "architectures must be a list of class names"),
        ({"architectures": [5]}, "architectures must be a list of class names"),
        ({"id2label": 5}, "id2label must be an object .got int 5"),
        ({"id2label": {"a": "b"}}, "transformers cannot read it"),
        ({"num_labels": 1e9}, "num_labels must be a whole number .got float"),
        ({"num_labels": 10**9}, r"num_labels must be at most 100,000 \(4.6x ImageNet-21k"),
        ({"vocab_size": 10**9}, "vocab_size must be at most 1,048,576"),
        ({"hidden_size": "wide"}, "hidden_size must be a whole number .got str"),
        ({"num_hidden_layers": 10**6}, r"num_hidden_layers must be at most 1,024 \(8x"),
        ({"num_attention_heads": True}, "num_attention_heads must be a whole number .got bool"),
        ({"text_config": {"hidden_size": 10**7}}, "hidden_size must be at most 65,536"),
        ({"hidden_size": 65536, "num_hidden_layers": 1024}, "describes about 1.8e.13 parameters"),
    ],
)
def test_a_config_with_wrong_types_or_absurd_sizes_is_refused_in_one_line(tmp_path, extra, message):
    spec = config(tmp_path, {**TINY_BERT, **extra})
    assert re.search(message, refusal(spec))


def test_deep_nesting_is_refused_without_a_recursion_error(tmp_path):
    assert "nests deeper than JSON can be read" in refusal(
        config(tmp_path, "[" * 200_000 + "]" * 200_000)
    )
    nested = {**TINY_BERT, "x": json.loads("[" * 40 + "]" * 40)}
    assert "nests deeper than 32 levels" in refusal(config(tmp_path, nested))


def test_ints_past_pythons_digit_limit_are_invalid_json(tmp_path):
    message = refusal(config(tmp_path, '{"model_type": "bert", "vocab_size": ' + "9" * 5000 + "}"))
    assert "is not valid JSON: Exceeds the limit (4300 digits)" in message


def test_a_directory_a_device_and_a_fifo_are_not_read(tmp_path):
    assert refusal(f"file:{tmp_path}").endswith("is not a regular file")
    assert refusal("file:/dev/zero").endswith("is not a regular file")
    fifo = tmp_path / "fifo.json"
    os.mkfifo(fifo)
    answer = []
    reader = threading.Thread(target=lambda: answer.append(refusal(f"file:{fifo}")), daemon=True)
    reader.start()
    reader.join(timeout=5)  # opening a FIFO without O_NONBLOCK waits for a writer, for ever
    assert answer and answer[0].endswith("is not a regular file")


def test_a_file_over_one_mib_is_refused_from_its_size(tmp_path):
    big = {**TINY_BERT, "id2label": {str(i): "x" * 40 for i in range(30_000)}}
    assert "is larger than 1 MiB: a config.json holds an architecture" in refusal(
        config(tmp_path, big)
    )


def test_a_file_that_grows_after_its_stat_is_read_no_further_than_the_cap(tmp_path, monkeypatch):
    path = tmp_path / "config.json"
    path.write_bytes(b" " * (2**20 + 10))
    real_fstat = os.fstat

    class Small:
        def __init__(self, info):
            self.st_mode, self.st_size = info.st_mode, 10

    monkeypatch.setattr(config_checks.os, "fstat", lambda fd: Small(real_fstat(fd)))
    with pytest.raises(config_checks.ConfigError, match="is larger than 1 MiB"):
        config_checks.read_config(path)


def test_a_config_transformers_cannot_build_is_one_line_at_build_time(tmp_path):
    spec = config(tmp_path, {**TINY_BERT, "hidden_act": "no-such-activation"})
    entry = models.find_model(spec)
    with pytest.raises(ValueError, match="transformers cannot build this config .KeyError"):
        models.build_model(entry, models.SEQUENCE_CLASSIFICATION)


@pytest.mark.parametrize(
    "spec",
    [
        "timm:local-dir:/etc",
        "timm:hf-hub:org/model",
        "timm:../../etc/passwd",
        "timm:/etc",
        "timm:resnet50.tag.more",
        "torchvision:../resnet",
        "torchvision:resnet50.tag",
        "hf:gpt2",
        "hf:../../etc",
        "hf:org/../x",
        "hf:org/name/extra",
        "hf:/abs/path",
        "hf:org--x/name",
        "hf:org/" + "n" * 97,
        "hf:C:/path",
    ],
)
def test_library_and_hub_specs_take_names_never_paths(spec):
    assert "model name: use" in refusal(spec)


@pytest.mark.parametrize(
    "spec", ["timm:convnext_tiny", "timm:vit_base_patch16_224.augreg_in21k", "torchvision:vit_b_16"]
)
def test_real_library_names_are_accepted(spec):
    assert models.find_model(spec).key == spec


def test_a_hub_name_is_checked_before_any_request(monkeypatch):
    import huggingface_hub

    def no_request(*args, **kwargs):
        raise AssertionError("no request for a bad name")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", no_request)
    assert "is not a hf model name: use hf:ORG/NAME" in refusal("hf:a/b:c")


def test_the_hub_cache_is_not_an_upload_but_is_read(tmp_path, monkeypatch):
    """With the app's upload-folder rule on, a hub config (in the hub's cache) still reads."""
    import huggingface_hub

    path = tmp_path / "cache" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY_BERT))
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kw: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda *a, **kw: str(path))
    sources.from_hub.cache_clear()
    sources.restrict_config_files(tmp_path / "uploads")
    assert models.find_model("hf:org/tiny").key == "hf:org/tiny"
    sources.from_hub.cache_clear()


@pytest.mark.parametrize(
    "argv",
    [
        ["measure", "--config-file", "/dev/zero", "--batch-size", "1"],
        ["measure", "timm:local-dir:/etc", "--batch-size", "1"],
        ["measure", "bert", "--batch-size", "1", "--seq-len", "99999999999"],
        ["analyze", "bert", "--margin", "1e400GiB"],
        ["analyze", "bert", "--price", "nan"],
        ["analyze", "bert", "--hours-per-run", "inf"],
        ["analyze", "bert", "--gpu-memory", "inf"],
        ["analyze", "bert", "--gpu-memory", "nan"],
        ["analyze", "bert", "--max-batch", "1000000000000"],
        ["analyze", "bert", "--lora-rank", "1000000000"],
    ],
)
def test_the_cli_refuses_each_in_one_line_with_status_2(argv, capsys):
    assert parser.main(argv) == 2
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and err.startswith("memorymark: error: ")
