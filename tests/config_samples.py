"""Config files the model-source tests share: pure data, no fixtures.

Not a test module: the config tests import it.
"""

# A one-layer BERT config.json, as a hub or an upload would hold it.
TINY_BERT = {
    "model_type": "bert",
    "hidden_size": 32,
    "num_attention_heads": 2,
    "num_hidden_layers": 1,
    "intermediate_size": 64,
    "vocab_size": 100,
}
