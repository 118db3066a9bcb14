"""HF Qwen4-Exp -> GGUF conversion (installed as pyqsa.convert)."""
