"""Config files the model-source tests share: pure data, no fixtures.

Not a test module: the config tests import it.
"""

import json

from memorymark.models import CONFIG_DIR

# A one-layer BERT config.json, as a hub or an upload would hold it.
TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "vocab_size": 100,
}

# The catalog's two-layer Llama (Llama 3's proportions of vocabulary to width: the logits
# dominate), as a hub or an upload would hold it.
TINY_LLAMA = {
    key: value
    for key, value in json.loads((CONFIG_DIR / "tiny-llama.json").read_text()).items()
    if not key.startswith("_")
}
