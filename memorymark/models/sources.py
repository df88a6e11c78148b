"""Models beyond the catalog: a config.json file, a hub config, a timm or torchvision model.

Each source becomes a `ModelEntry` the rest of the engine treats like a catalog model:

- `file:PATH` (the CLI's `--config-file`): any transformers `config.json`, read and checked
  by `config_checks` (a regular file, capped size, sane types and sizes) and then by
  transformers' own config class; its tasks come from the transformers auto-model
  mappings for its `model_type`, its default task from its `architectures`;
- `upload:NAME`: a config.json the app saved in its upload folder (`UPLOAD_DIR/NAME/config.json`),
  read as a file; the spec names the upload, never a path, so a hosted app shows no server path;
- `hf:ORG/NAME`: fetches only `config.json` from the Hugging Face hub (never weights), then as
  a file; offline, one line within seconds says so and how to pass `--config-file` instead;
- `timm:NAME`, `torchvision:NAME`: built by those libraries with no pretrained weights; both are
  optional installs, and a missing one is a one-line error.

Names are checked against each source's own name syntax before anything is fetched or built, so
a spec is a model name and never a path (timm reads `local-dir:/any/folder` as one). This module
resolves and describes models; it never measures anything.
"""

from __future__ import annotations

import hashlib
import importlib
import os
import re
import tempfile
from functools import cache
from pathlib import Path
from typing import Any

from memorymark import limits
from memorymark.models import config_checks
from memorymark.models import entry as model_entry

# Task -> transformers' auto mapping (model_type -> class name) that builds it.
_TASK_MAPPINGS = (
    (model_entry.CAUSAL_LM, "MODEL_FOR_CAUSAL_LM_MAPPING_NAMES"),
    (model_entry.SEQUENCE_CLASSIFICATION, "MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES"),
    (model_entry.SEQ2SEQ_LM, "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES"),
    (model_entry.IMAGE_CLASSIFICATION, "MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES"),
)
# Suffixes of `architectures` entries that name the task a checkpoint was trained for.
_ARCHITECTURE_TASKS = (
    ("ForCausalLM", model_entry.CAUSAL_LM),
    ("LMHeadModel", model_entry.CAUSAL_LM),
    ("ForSequenceClassification", model_entry.SEQUENCE_CLASSIFICATION),
    ("ForImageClassification", model_entry.IMAGE_CLASSIFICATION),
    ("ForConditionalGeneration", model_entry.SEQ2SEQ_LM),
    # Masked-LM checkpoints (BERT, RoBERTa) are fine-tuned as classifiers.
    ("ForMaskedLM", model_entry.SEQUENCE_CLASSIFICATION),
)
# Config keys that cap the sequence length, in the order transformers families use them.
_POSITION_KEYS = ("max_position_embeddings", "n_positions")
# What each source accepts as a name. The hub's: ORG/NAME, each part ASCII letters, digits, "-",
# "_" and ".", at most 96 characters, no "--" or ".." (huggingface_hub's validate_repo_id,
# utils/_validators.py, mirroring the hub's own Names.ts). timm's: lowercase model names of
# letters, digits and "_", with an optional ".tag" for the pretrained config (timm's
# `list_models()` names, e.g. vit_base_patch16_224.augreg_in21k); its "hf-hub:" and
# "local-dir:" schemes are refused. torchvision's: `torchvision.models.list_models()` names.
_NAMES = {
    "upload": re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII),  # model_inputs.save_upload's folders
    "hf": re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,95}/[A-Za-z0-9][A-Za-z0-9_.-]{0,95}", re.ASCII),
    "timm": re.compile(r"[A-Za-z0-9_]{1,128}(\.[A-Za-z0-9_]{1,128})?", re.ASCII),
    "torchvision": re.compile(r"[A-Za-z0-9_]{1,128}", re.ASCII),
}
_NAME_HELP = {
    "upload": "upload:NAME, as the app's upload names it",
    "hf": "hf:ORG/NAME, e.g. hf:openai-community/gpt2",
    "timm": "timm:NAME or timm:NAME.TAG, e.g. timm:convnext_tiny",
    "torchvision": "torchvision:NAME, e.g. torchvision:resnet50",
}
# Seconds to wait for the hub: huggingface_hub's own HF_HUB_ETAG_TIMEOUT when set, else this.
HUB_TIMEOUT_SECONDS = 5.0


UPLOAD_DIR = Path(tempfile.gettempdir()) / "memorymark-uploads"
"""Where the app writes an uploaded config.json (one folder per upload) and `upload:` reads it;
the same folder in the server and its worker processes, which share a temporary directory."""
UPLOAD_FILE = "config.json"


def save_config(stem: str, data: bytes, root: Path | None = None) -> Path:
    """Write a config.json's bytes under `root` (else UPLOAD_DIR), in a folder named after
    `stem` and a digest of the bytes, and return that folder: one per content, so the same
    bytes land once, and its name is an `upload:NAME` (ASCII letters, digits, `_` and `-`)."""
    digest = hashlib.sha256(data).hexdigest()[:10]
    safe = re.sub(r"[^A-Za-z0-9_]+", "-", stem, flags=re.ASCII)[:40].strip("-")
    folder = (root or UPLOAD_DIR) / f"{safe or 'config'}-{digest}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / UPLOAD_FILE).write_bytes(data)
    return folder


class ModelSourceError(ValueError):
    """A model spec that cannot be resolved: bad file, unknown type, hub unreachable."""


_config_root: Path | None = None


def restrict_config_files(root: Path | None) -> None:
    """Read `file:` configs only from under `root` (None lifts the limit).

    A hosted app takes model specs from links and text boxes; without this, anyone could make
    it read (or probe for) any path on the server. The app limits them to its upload folder.
    """
    global _config_root
    _config_root = root.resolve() if root is not None else None
    from_config_file.cache_clear()


def check_spec(spec: str) -> tuple[str, str]:
    """(source, name) of a `file:`, `upload:`, `hf:`, `timm:` or `torchvision:` spec of the
    right form; ModelSourceError otherwise. Reads nothing: Settings validate with it."""
    prefix, _, name = spec.partition(":")
    if not name:
        raise ModelSourceError(f"model spec {limits.shown(spec)} names nothing after '{prefix}:'")
    if prefix in _NAMES and not (
        _NAMES[prefix].fullmatch(name) and ".." not in name and "--" not in name
    ):
        article = "an" if prefix == "upload" else "a"
        raise ModelSourceError(
            f"{limits.shown(name)} is not {article} {prefix} model name: use {_NAME_HELP[prefix]}"
        )
    if prefix not in ("file", "upload", "hf", "timm", "torchvision"):
        raise ModelSourceError(
            f"unknown model source {limits.shown(prefix)}: use file:, hf:, timm: or torchvision:"
        )
    return prefix, name


def resolve(spec: str) -> model_entry.ModelEntry:
    """The entry for a `file:`, `hf:`, `timm:` or `torchvision:` spec (reads a `file:` config,
    or the hub for `hf:`)."""
    prefix, name = check_spec(spec)
    if prefix == "file":
        return from_config_file(name)
    if prefix == "upload":
        return from_upload(name)
    if prefix == "hf":
        return from_hub(name)
    # timm or torchvision: check_spec accepts no other prefix.
    return model_entry.ModelEntry(
        key=spec,
        display_name=f"{name} ({prefix})",
        config_file="",
        tasks=(model_entry.IMAGE_CLASSIFICATION,),
        default_task=model_entry.IMAGE_CLASSIFICATION,
        num_labels=1000,
        source=prefix,
    )


@cache
def from_config_file(path: str) -> model_entry.ModelEntry:
    """An entry for any transformers config.json on disk."""
    if _config_root is not None and not Path(path).expanduser().resolve().is_relative_to(
        _config_root
    ):
        raise ModelSourceError(
            "this app reads config files only from its uploads: upload the config.json instead"
        )
    return _entry_from_file(path)


@cache
def from_upload(name: str) -> model_entry.ModelEntry:
    """An entry for the config.json the app saved as upload `name`. Its messages name the
    upload, not where the server keeps it (a hosted app shows no server path)."""
    path = UPLOAD_DIR / name / UPLOAD_FILE
    entry = _entry_from_file(str(path), shown=limits.shown(f"upload:{name}"))
    return model_entry.ModelEntry(**{**_fields(entry), "key": f"upload:{name}"})


def _entry_from_file(path: str, *, shown: str | None = None) -> model_entry.ModelEntry:
    """The entry of the config.json at `path`; messages call it `shown` (the path itself
    unless the caller names it otherwise)."""
    shown = shown or limits.shown(path)
    try:
        data = config_checks.read_config(Path(path).expanduser(), shown=shown)
    except config_checks.ConfigError as exc:
        raise ModelSourceError(str(exc)) from None
    model_type = data["model_type"]
    tasks = tasks_for(model_type)
    if not tasks:
        raise ModelSourceError(
            f"{shown}: model_type {limits.shown(model_type)} has no sequence-classification, "
            "causal-lm, seq2seq-lm or image-classification model in this transformers"
        )
    _check_with_transformers(model_type, data, shown)
    positions = [data[k] for k in _POSITION_KEYS if isinstance(data.get(k), int)]
    labels = (
        data.get("num_labels")
        or len(data.get("id2label") or {})
        or (1000 if tasks == (model_entry.IMAGE_CLASSIFICATION,) else 2)
    )
    return model_entry.ModelEntry(
        key=f"file:{path}",
        display_name=f"{Path(path).parent.name or Path(path).stem} ({model_type})",
        config_file=str(Path(path).expanduser().resolve()),
        tasks=tasks,
        default_task=_default_task(data, tasks),
        max_positions=positions[0] if positions and model_type != "t5" else None,
        num_labels=int(labels),
        source="config",
    )


def _check_with_transformers(model_type: str, data: dict[str, Any], shown: str) -> None:
    """Build the config object as `models.build_model` will, so a value transformers refuses
    (an id2label with non-integer keys, a str where it wants a number) is refused here."""
    from transformers import AutoConfig

    fields = {k: v for k, v in data.items() if k != "model_type" and not k.startswith("_")}
    try:
        AutoConfig.for_model(model_type, **fields)
    except Exception as exc:  # noqa: BLE001 - whatever transformers raises, the file is the cause
        reason = str(exc).strip().splitlines()[0][:100] if str(exc).strip() else ""
        raise ModelSourceError(
            f"config file {shown}: transformers cannot read it ({type(exc).__name__}: {reason})"
        ) from None


def tasks_for(model_type: str | None) -> tuple[str, ...]:
    """The tasks transformers can build for `model_type`, in MemoryMark's task names."""
    if not model_type:
        return ()
    from transformers.models.auto import modeling_auto

    return tuple(
        task
        for task, mapping in _TASK_MAPPINGS
        if model_type in getattr(modeling_auto, mapping, {})
    )


def _default_task(data: dict[str, Any], tasks: tuple[str, ...]) -> str:
    for architecture in data.get("architectures") or ():
        for suffix, task in _ARCHITECTURE_TASKS:
            if architecture.endswith(suffix) and task in tasks:
                return task
    return tasks[0]


@cache
def from_hub(repo_id: str) -> model_entry.ModelEntry:
    """Fetch only `config.json` of `repo_id` from the Hugging Face hub, then read it."""
    try:
        path = _hub_config_path(repo_id)
    except Exception as exc:  # noqa: BLE001 - every failure here has the same way forward
        reason = type(exc).__name__
        raise ModelSourceError(
            f"could not fetch {repo_id}'s config.json from the Hugging Face hub ({reason}); "
            f"download it where the hub is reachable and pass --config-file PATH"
        ) from None
    # The hub's cache, not a user's path: no upload-folder rule, and messages name the repo, not
    # where the server caches it.
    entry = _entry_from_file(path, shown=limits.shown(f"hf:{repo_id}"))
    return model_entry.ModelEntry(
        **{**_fields(entry), "key": f"hf:{repo_id}", "display_name": f"{repo_id} (hub)"}
    )


def _hub_config_path(repo_id: str) -> str:
    """The local path of `repo_id`'s config.json: fetched when the hub answers one request
    within the timeout, else a copy cached by an earlier fetch, else the hub's error.

    `hf_hub_download` alone, with nothing cached, retries a failed first request five times
    with backoff and a 60 s timeout (huggingface_hub 1.x and 2.x, file_download.py:
    `_ETAG_RETRY_TIMEOUT`, `retry_on_errors=True`), printing a line per retry: 25-47 s before
    it gives up offline. `get_hf_file_metadata` makes one request, with no retry.
    """
    from huggingface_hub import get_hf_file_metadata, hf_hub_download, hf_hub_url

    timeout = hub_timeout_seconds()
    try:
        get_hf_file_metadata(hf_hub_url(repo_id, "config.json"), timeout=timeout)
    except Exception:
        try:
            return hf_hub_download(repo_id, "config.json", local_files_only=True)
        except Exception:  # noqa: BLE001 - not cached either: the hub's error says why
            pass
        raise
    return hf_hub_download(repo_id, "config.json", etag_timeout=timeout)


def hub_timeout_seconds() -> float:
    """huggingface_hub's HF_HUB_ETAG_TIMEOUT (seconds) when set to a number, else 5."""
    try:
        seconds = float(os.environ.get("HF_HUB_ETAG_TIMEOUT", ""))
    except ValueError:
        return HUB_TIMEOUT_SECONDS
    return seconds if 0 < seconds <= 60 else HUB_TIMEOUT_SECONDS


def _fields(entry: model_entry.ModelEntry) -> dict[str, Any]:
    return {name: getattr(entry, name) for name in entry.__dataclass_fields__}


def build_library_model(entry: model_entry.ModelEntry, image_size: int | None) -> Any:
    """A timm or torchvision classifier with random weights (no pretrained download)."""
    name = entry.key.partition(":")[2]
    library = _import(entry.source)
    if entry.source == "timm":
        kwargs: dict[str, Any] = {"pretrained": False, "num_classes": entry.num_labels}
        if image_size is not None:
            kwargs["img_size"] = image_size  # only models with a fixed size (ViTs) read it
        try:
            return library.create_model(name, **kwargs)
        except TypeError:
            kwargs.pop("img_size", None)
            return library.create_model(name, **kwargs)
        except RuntimeError as exc:  # timm raises RuntimeError('Unknown model (...)')
            raise ModelSourceError(f"timm has no model {name!r}: {exc}") from None
    try:
        return library.models.get_model(name, weights=None, num_classes=entry.num_labels)
    except ValueError as exc:
        raise ModelSourceError(f"torchvision has no model {name!r}: {exc}") from None


def _import(library: str) -> Any:
    try:
        return importlib.import_module(library)
    except Exception as exc:  # noqa: BLE001 - a broken install is as unusable as a missing one
        raise ModelSourceError(
            f"{library} is not usable here ({type(exc).__name__}: {str(exc)[:80]}); "
            f"install a {library} that matches your torch (pip install {library})"
        ) from None
