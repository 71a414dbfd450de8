"""Renderers: `render(diagnosis, evidence) -> str`, one module per format."""
