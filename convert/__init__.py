"""HF Qwen4-Exp -> GGUF conversion (installed as pyqsa.convert).

Modules, one concern each:
    errors      ConvertError, the one exception for bad input (one line, CLI exit code 2)
    names       GGUF key/tensor names for arch qwen4exp and the pyqsa.* keys
    hf_config   read + validate + normalise config.json (HF's defaults) -> ModelConfig
    checkpoint  tensor sources: lazy safetensors reader (bf16 without torch), numpy mappings
    tensors     HF tensor -> GGUF name/shape/transform plan; missing/extra/shape checks
    gguf_file   fast GGUF reader (metadata, tensor infos, memory-mapped data)
    tokenizer   tokenizer.* keys from an HF tokenizer folder or a vocab-only GGUF
    metadata    the qwen4exp keys upstream's loader reads
    synthetic   random HF-named weights for a config, numpy only (demo and benchmark models)
    qsa         pyqsa.* keys: QSA layer map, ratio, budget, KV scales
    calibrate   KV absmax: calibration in the runtime (llama_cpp), or a weight estimate
    writer      atomic GGUF writing (temp + rename), disk check, progress bar
    pipeline    write_model, convert_checkpoint, refresh_qsa
    inspect     summary of a GGUF for `pyqsa inspect`
    cli         click commands convert and inspect
"""

from .errors import ConvertError
from .pipeline import convert_checkpoint, refresh_qsa, write_model
from .synthetic import hf_tensor_shapes, random_tensors
from .tokenizer import Tokenizer, from_hf_dir, from_vocab_gguf, qwen_vocab_gguf

__all__ = [
    "ConvertError",
    "Tokenizer",
    "convert_checkpoint",
    "from_hf_dir",
    "from_vocab_gguf",
    "hf_tensor_shapes",
    "qwen_vocab_gguf",
    "random_tensors",
    "refresh_qsa",
    "write_model",
]
