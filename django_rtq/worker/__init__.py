"""The worker server: one module per component, wired together in `server.py`."""
