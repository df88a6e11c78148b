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

# A two-layer Llama with Llama 3's proportions of vocabulary to width (the logits dominate).
TINY_LLAMA = {
    "model_type": "llama",
    "architectures": ["LlamaForCausalLM"],
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 8192,
    "max_position_embeddings": 4096,
    "tie_word_embeddings": False,
}
