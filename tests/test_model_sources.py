"""Models beyond the catalog: config files, the hub (offline here), timm and torchvision."""

import json
import sys
import types
from pathlib import Path

import pytest
from config_samples import TINY_BERT
from torch import nn

from memorymark import models
from memorymark.backends.sim import SimBackend
from memorymark.engine import Session
from memorymark.fit import FitPolicy
from memorymark.models import sources
from memorymark.settings import Settings
from memorymark.step.catalog import CatalogStep

BIG = 8 * 2**30


pytestmark = pytest.mark.usefixtures("any_config_path")


def write_config(tmp_path, **data):
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    return str(path)


def test_a_config_file_trains_with_the_task_its_architecture_names(tmp_path):
    path = write_config(
        tmp_path,
        model_type="llama",
        architectures=["LlamaForCausalLM"],
        hidden_size=32,
        intermediate_size=64,
        num_attention_heads=2,
        num_key_value_heads=1,
        num_hidden_layers=2,
        vocab_size=500,
        max_position_embeddings=64,
    )
    entry = models.find_model(f"file:{path}")
    assert entry.default_task == models.CAUSAL_LM
    assert set(entry.tasks) >= {models.CAUSAL_LM, models.SEQUENCE_CLASSIFICATION}
    assert entry.max_positions == 64
    m = SimBackend(
        CatalogStep(Settings(model=f"file:{path}", seq_len=16)),
        policy=FitPolicy(capacity_bytes=BIG),
    )
    assert m.measure(2).fits
    with pytest.raises(ValueError, match="seq_len 65 exceeds"):
        Session(Settings(model=f"file:{path}", seq_len=65))


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "is not valid JSON"),
        ('{"hidden_size": 3}', "has no model_type"),
        ('{"model_type": "no-such-model"}', "model_type 'no-such-model' has no"),
    ],
)
def test_a_bad_config_file_is_one_line(tmp_path, content, message):
    path = tmp_path / "config.json"
    path.write_text(content)
    with pytest.raises(ValueError, match=message) as info:
        Session(Settings(model=f"file:{path}"))
    assert "\n" not in str(info.value)


def test_a_missing_config_file(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        Session(Settings(model=f"file:{tmp_path / 'nope.json'}"))


def test_the_hub_unreachable_says_how_to_pass_a_config_file(monkeypatch):
    import huggingface_hub

    def offline(*args, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("no connection")

    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", offline)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", offline)
    sources.from_hub.cache_clear()
    settings = Settings(model="hf:org/model")  # validating reads nothing
    with pytest.raises(ValueError, match="could not fetch org/model's config.json") as info:
        Session(settings)
    assert "--config-file PATH" in str(info.value)


def test_a_hub_config_is_read_like_a_file(monkeypatch, tmp_path):
    import huggingface_hub

    path = write_config(
        tmp_path, **TINY_BERT, max_position_embeddings=64, architectures=["BertForMaskedLM"]
    )
    monkeypatch.setattr(huggingface_hub, "get_hf_file_metadata", lambda url, **kw: None)
    monkeypatch.setattr(huggingface_hub, "hf_hub_download", lambda repo, name, **kw: path)
    sources.from_hub.cache_clear()
    entry = models.find_model("hf:someone/tiny-bert")
    assert entry.key == "hf:someone/tiny-bert"
    assert entry.default_task == models.SEQUENCE_CLASSIFICATION


class TinyClassifier(nn.Module):
    def __init__(self, num_classes):
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3)
        self.head = nn.Linear(8, num_classes)

    def forward(self, x):
        return self.head(self.conv(x).mean(dim=(2, 3)))


@pytest.fixture
def fake_timm(monkeypatch):
    calls = []

    def create_model(name, pretrained, num_classes, **kwargs):
        calls.append((name, pretrained, num_classes))
        if name != "convnext_tiny":
            raise RuntimeError(f"Unknown model ({name})")
        return TinyClassifier(num_classes)

    monkeypatch.setitem(sys.modules, "timm", types.SimpleNamespace(create_model=create_model))
    return calls


def test_timm_models_are_built_without_pretrained_weights_and_trained(fake_timm):
    settings = Settings(model="timm:convnext_tiny", image_size=32)
    m = SimBackend(CatalogStep(settings), policy=FitPolicy(capacity_bytes=BIG)).measure(4)
    assert m.fits and m.breakdown.optimizer_state > 0
    assert fake_timm[0] == ("convnext_tiny", False, 1000)
    with pytest.raises(ValueError, match="timm has no model 'nope'"):
        models.build_model(models.find_model("timm:nope"), models.IMAGE_CLASSIFICATION)


def test_torchvision_models_use_get_model_without_weights(monkeypatch):
    seen = {}

    def get_model(name, weights, num_classes):
        seen.update(name=name, weights=weights)
        return TinyClassifier(num_classes)

    fake = types.SimpleNamespace(models=types.SimpleNamespace(get_model=get_model))
    monkeypatch.setitem(sys.modules, "torchvision", fake)
    m = SimBackend(
        CatalogStep(Settings(model="torchvision:resnet18", image_size=32)),
        policy=FitPolicy(capacity_bytes=BIG),
    ).measure(2)
    assert m.fits
    assert seen == {"name": "resnet18", "weights": None}


def test_a_library_that_will_not_import_is_one_line(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import raises ImportError
    entry = models.find_model("torchvision:resnet18")
    with pytest.raises(ValueError, match="torchvision is not usable here") as info:
        models.build_model(entry, models.IMAGE_CLASSIFICATION)
    assert "pip install torchvision" in str(info.value)


def test_config_files_can_be_limited_to_one_folder(tmp_path):
    inside = tmp_path / "uploads"
    inside.mkdir()
    allowed = write_config(inside, **TINY_BERT)
    outside = write_config(tmp_path, model_type="gpt2")
    sources.restrict_config_files(inside)
    try:
        assert models.find_model(f"file:{allowed}").source == "config"
        with pytest.raises(ValueError, match="reads config files only from its uploads"):
            models.find_model(f"file:{outside}")
        with pytest.raises(ValueError, match="only from its uploads"):
            models.find_model(f"file:{inside}/../config.json")
    finally:
        sources.restrict_config_files(None)
    assert models.find_model(f"file:{outside}").source == "config"


def test_settings_validate_a_spec_s_form_and_read_nothing(monkeypatch, tmp_path):
    def no_io(*args, **kwargs):
        raise AssertionError("Settings validation read a file or the hub")

    no_io.cache_clear = lambda: None  # restrict_config_files clears the real one's cache

    monkeypatch.setattr(sources, "from_hub", no_io)
    monkeypatch.setattr(sources, "from_config_file", no_io)
    Settings(model="hf:org/model", task="causal-lm", seq_len=100_000)
    Settings(model=f"file:{tmp_path / 'nope.json'}")
    with pytest.raises(ValueError, match="is not a hf model name"):
        Settings(model="hf:not a repo")
    with pytest.raises(ValueError, match="unknown model source 'ftp'"):
        Settings(model="ftp:x")


def test_a_bad_hub_config_is_named_by_its_repo_not_the_servers_cache(monkeypatch, tmp_path):
    # A hosted app shows no server path: the hub's cache is one.
    bad = tmp_path / "config.json"
    bad.write_text('{"model_type": "bert", ')
    monkeypatch.setattr(sources, "_hub_config_path", lambda repo_id: str(bad))
    sources.from_hub.cache_clear()
    with pytest.raises(sources.ModelSourceError, match="config file 'hf:org/broken' is not valid"):
        sources.from_hub("org/broken")
    sources.from_hub.cache_clear()


def test_an_upload_is_read_by_name_from_the_upload_folder(monkeypatch, tmp_path):
    folder = tmp_path / "my-bert-0123456789"
    folder.mkdir()
    (folder / "config.json").write_text(Path(models.CONFIG_DIR, "tiny-bert.json").read_text())
    monkeypatch.setattr(sources, "UPLOAD_DIR", tmp_path)
    sources.from_upload.cache_clear()
    entry = sources.resolve("upload:my-bert-0123456789")
    assert entry.key == "upload:my-bert-0123456789" and entry.default_task
    with pytest.raises(sources.ModelSourceError, match="not an upload model name"):
        sources.check_spec("upload:../etc")
    with pytest.raises(sources.ModelSourceError, match="config file 'upload:gone' does not exist"):
        sources.resolve("upload:gone")
    sources.from_upload.cache_clear()
