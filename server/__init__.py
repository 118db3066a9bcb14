"""OpenAI-compatible HTTP server (installed as pyqsa.server).

Module map: app (routes, templating, response shaping) | streams (engine events -> SSE or a
whole reply, cancel on disconnect) | protocol (pydantic requests, response envelopes) |
chat_template (Jinja templates, Qwen tool calls) | qwen_template (the default template, data
only) | errors (OpenAI-shaped errors, body limit) |
metrics (Prometheus) | cli (`pyqsa serve`, `pyqsa chat`) | chat_client (the terminal chat).
"""
