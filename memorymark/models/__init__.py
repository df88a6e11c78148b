"""Models: the built-in catalog, models from elsewhere, and building one from its config.

Owns what a model is to MemoryMark (`ModelEntry`: its tasks and limits), the shipped architecture
configs (`configs/`), configs from a file, the hub, timm or torchvision (`sources`), the checks a
user's config passes before transformers sees it (`config_checks`), and building a model with
random weights on the device the caller chooses.

Must not know: fake tensors, measurement, optimizers, or how anything is shown. Nothing here
loads weights.
"""

from memorymark.models.catalog import (
    CATALOG,
    CONFIG_DIR,
    UnknownModelError,
    build_model,
    check_model_spec,
    check_task_and_length,
    config_of,
    count_parameters,
    find_model,
    model_keys,
    parameter_count,
)
from memorymark.models.entry import (
    CAUSAL_LM,
    DECODER_TASKS,
    IMAGE_CLASSIFICATION,
    SEQ2SEQ_LM,
    SEQUENCE_CLASSIFICATION,
    TEXT_CLASSIFIERS,
    ModelEntry,
)

__all__ = [
    "CATALOG",
    "CAUSAL_LM",
    "CONFIG_DIR",
    "DECODER_TASKS",
    "IMAGE_CLASSIFICATION",
    "SEQ2SEQ_LM",
    "SEQUENCE_CLASSIFICATION",
    "TEXT_CLASSIFIERS",
    "ModelEntry",
    "UnknownModelError",
    "build_model",
    "check_model_spec",
    "check_task_and_length",
    "config_of",
    "count_parameters",
    "find_model",
    "model_keys",
    "parameter_count",
]
