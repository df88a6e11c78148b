"""The Streamlit app's shared pieces: chart builders, the sidebar, the sweep runner and views.

Only the app (`app.py`, `pages/`) imports this package. It calls the engine's public API
(`Settings`, `Analysis`, `Report`, `compare_gpus`, `iter_protocols`, `snippet`) and never touches
tensors or `torch.cuda` itself; the engine never imports it.
"""
