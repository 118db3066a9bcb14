"""OpenAI-compatible HTTP server (installed as pyqsa.server)."""
