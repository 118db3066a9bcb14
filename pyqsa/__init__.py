"""pyqsa: long-context sparse-attention serving for Qwen4-Exp models on patched llama.cpp."""

__version__ = "0.1.0"
