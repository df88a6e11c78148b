"""The Streamlit app's shared pieces: chart builders, the sidebar, the sweep runner and views.

Only the app (`app.py`, `pages/`) imports this package. It reaches the engine through its front
door (`memorymark.engine.Session`) and plain value types (`Settings`, `Costs`, `Measurement`,
`Report`, `GPU`, and the records a Session returns), never tensors or `torch.cuda`: importing it
loads no torch (tests/test_boundaries.py checks with torch made unimportable). The engine never
imports it.

Must not know: tensors, devices, or how a step is measured; it draws what the engine returns.
"""
