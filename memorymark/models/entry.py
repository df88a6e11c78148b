"""What a model is to MemoryMark, apart from how it is built: the tasks it trains for and the
`ModelEntry` record every source of models (the catalog, config files, the hub, timm,
torchvision) produces. No torch, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass

SEQUENCE_CLASSIFICATION = "sequence-classification"
CAUSAL_LM = "causal-lm"
IMAGE_CLASSIFICATION = "image-classification"
SEQ2SEQ_LM = "seq2seq-lm"
TEXT_CLASSIFIERS = (SEQUENCE_CLASSIFICATION,)
DECODER_TASKS = (CAUSAL_LM, SEQUENCE_CLASSIFICATION)


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelEntry:
    """One catalog model: where its config lives and what it can be trained for."""

    key: str
    display_name: str
    config_file: str
    tasks: tuple[str, ...]
    default_task: str
    max_positions: int | None = None
    """The longest sequence the model's position embeddings allow; None for image models."""
    num_labels: int = 2
    """Classes of the classification head (sequence classification: 2, as a typical fine-tune)."""
    source: str = "catalog"
    """catalog or config (a transformers config.json), timm, torchvision (their own builders)."""

    @property
    def input_kind(self) -> str:
        """text (takes token ids and a sequence length) or image (takes pixels and a size)."""
        return "image" if IMAGE_CLASSIFICATION in self.tasks else "text"
