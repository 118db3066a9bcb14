"""Tokenizer metadata for the GGUF: from an HF tokenizer folder or a vocab-only GGUF.

Both give a `Tokenizer` (the `tokenizer.*` keys upstream reads for a gpt2/BPE vocab). The HF
folder is read as files (tokenizer.json, tokenizer_config.json, chat template) with no
`tokenizers`/`transformers` import, and the pre-tokenizer is the one transformers' AutoTokenizer
really runs: Qwen tokenizer classes build their own pipeline (regex + NFC) and ignore
tokenizer.json's, and for some model types AutoTokenizer even ignores the hub's class. The name
is never guessed from a hash of a sample encoding: qwen2 and qwen35 tokenize upstream's sample
identically but differ on combining marks.

llama.cpp's BPE has no normalizer. When HF applies NFC, the file says so in
`pyqsa.tokenizer.normalizer` and pyqsa NFC-normalises text before calling llama_tokenize.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import gguf
from gguf import GGUFValueType as T

from . import names as N
from .errors import ConvertError
from .gguf_file import GGUFFile

# the Split regexes of the Qwen byte-level BPE tokenizers, keyed by llama.cpp pre-tokenizer name
_PRE_REGEXES = {
    "qwen35": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
    "qwen2": r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+",
}
# transformers 5.23 tokenization_auto.py: these model types ignore the hub's tokenizer_class
_AUTO_CLASSES = dict.fromkeys(
    ("qwen4_exp", "qwen3_5", "qwen3_5_text", "qwen3_5_moe", "qwen3_5_moe_text"), "Qwen3_5Tokenizer"
)
# tokenizer classes that build their own pipeline: (pre-tokenizer, normalizer)
_CLASS_PIPELINES = {
    "Qwen2Tokenizer": ("qwen2", "NFC"),
    "Qwen2TokenizerFast": ("qwen2", "NFC"),
    "Qwen3_5Tokenizer": ("qwen35", "NFC"),
    "Qwen3_5TokenizerFast": ("qwen35", "NFC"),
}
_SPECIAL_KEYS = {"bos": "bos_token_id", "eos": "eos_token_id", "pad": "padding_token_id"}


@dataclass(frozen=True)
class Tokenizer:
    """A gpt2-style (byte-level BPE) vocabulary as upstream's llama-vocab.cpp loads it."""

    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    pre: str
    special_ids: dict[str, int] = field(default_factory=dict)  # bos / eos / pad
    add_bos: bool | None = None
    add_eos: bool | None = None
    chat_template: str | None = None
    normalizer: str | None = None  # "NFC": normalise text before llama_tokenize

    def kv(self) -> list[tuple[str, object, T, T | None]]:
        """(key, value, type, array sub-type) for the GGUF writer."""
        out: list[tuple[str, object, T, T | None]] = [
            ("tokenizer.ggml.model", "gpt2", T.STRING, None),
            ("tokenizer.ggml.pre", self.pre, T.STRING, None),
            ("tokenizer.ggml.tokens", self.tokens, T.ARRAY, T.STRING),
            ("tokenizer.ggml.token_type", self.token_types, T.ARRAY, T.INT32),
            ("tokenizer.ggml.merges", self.merges, T.ARRAY, T.STRING),
        ]
        for kind, tid in self.special_ids.items():
            out.append((f"tokenizer.ggml.{_SPECIAL_KEYS[kind]}", tid, T.UINT32, None))
        for kind, flag in (("bos", self.add_bos), ("eos", self.add_eos)):
            if flag is not None:
                out.append((f"tokenizer.ggml.add_{kind}_token", flag, T.BOOL, None))
        if self.chat_template:
            out.append(("tokenizer.chat_template", self.chat_template, T.STRING, None))
        if self.normalizer:
            out.append((N.PYQSA_TOKENIZER_NORMALIZER, self.normalizer, T.STRING, None))
        return out

    def check_vocab_size(self, vocab_size: int) -> None:
        if len(self.tokens) != vocab_size:
            raise ConvertError(
                f"tokenizer has {len(self.tokens)} tokens, the model's vocab_size is {vocab_size}"
            )


def from_vocab_gguf(path: Path, pre: str = "qwen35") -> Tokenizer:
    """Copy the tokenizer of a vocab-only GGUF (e.g. upstream's ggml-vocab-qwen35.gguf)."""
    get = GGUFFile(path).get

    if get("tokenizer.ggml.model") != "gpt2":
        raise ConvertError(f"{path}: tokenizer model {get('tokenizer.ggml.model')!r} != 'gpt2'")
    special = {k: get(f"tokenizer.ggml.{v}") for k, v in _SPECIAL_KEYS.items()}
    return Tokenizer(
        tokens=get("tokenizer.ggml.tokens"),
        token_types=get("tokenizer.ggml.token_type"),
        merges=get("tokenizer.ggml.merges"),
        pre=pre,
        special_ids={k: int(v) for k, v in special.items() if v is not None},
        add_bos=get("tokenizer.ggml.add_bos_token"),
        add_eos=get("tokenizer.ggml.add_eos_token"),
        chat_template=get("tokenizer.chat_template"),
        normalizer=get(N.PYQSA_TOKENIZER_NORMALIZER),
    )


def _pipeline(tok_json: dict, tok_class: str | None) -> tuple[str, str | None]:
    """(pre-tokenizer name, normalizer) of what AutoTokenizer will run."""
    if tok_class in _CLASS_PIPELINES:
        return _CLASS_PIPELINES[tok_class]
    norm = tok_json.get("normalizer")
    kind = norm.get("type") if isinstance(norm, dict) else None
    if kind not in (None, "NFC"):
        raise ConvertError(f"tokenizer.json: unsupported normalizer {kind!r} (none or NFC)")
    return _pre_name(tok_json), kind


def _pre_name(tok_json: dict) -> str:
    def regexes(pt: dict | None):
        if not pt:
            return
        if pt.get("type") == "Sequence":
            for sub in pt.get("pretokenizers", []):
                yield from regexes(sub)
        elif pt.get("type") == "Split":
            yield pt.get("pattern", {}).get("Regex")

    for rx in regexes(tok_json.get("pre_tokenizer")):
        for name, known in _PRE_REGEXES.items():
            if rx == known:
                return name
    raise ConvertError(
        "tokenizer.json: unsupported pre-tokenizer (expected the Qwen byte-level BPE split regex)"
    )


def from_hf_dir(hf_dir: Path, vocab_size: int, model_type: str | None = None) -> Tokenizer:
    """Read an HF fast-tokenizer folder; ids without a token become [PAD<id>] (UNUSED).

    `model_type` (config.json's) matters because AutoTokenizer picks the class by it for some
    types, whatever tokenizer_config.json says.
    """
    path = Path(hf_dir) / "tokenizer.json"
    try:
        tj = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConvertError(f"{path}: not found (the GGUF needs the tokenizer)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ConvertError(f"{path}: unreadable tokenizer ({e})") from None
    model = tj.get("model") or {}
    if model.get("type") != "BPE":
        raise ConvertError(f"{path}: tokenizer model {model.get('type')!r} is not BPE")
    vocab: dict[str, int] = dict(model.get("vocab", {}))
    added = {t["content"]: t for t in tj.get("added_tokens", [])}
    for content, t in added.items():
        vocab[content] = t["id"]
    if max(vocab.values(), default=-1) >= vocab_size:
        raise ConvertError(f"{path}: token ids exceed the model's vocab_size {vocab_size}")
    by_id = {i: s for s, i in vocab.items()}
    tokens, types = [], []
    for i in range(vocab_size):
        s = by_id.get(i)
        if s is None:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif s in added:
            control = added[s].get("special") or (s.startswith("<|") and s.endswith("|>"))
            tokens.append(s)
            types.append(gguf.TokenType.CONTROL if control else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(s)
            types.append(gguf.TokenType.NORMAL)
    sv = gguf.SpecialVocab(hf_dir, load_merges=True, n_vocab=vocab_size)
    if not sv.merges:
        raise ConvertError(f"{path}: no BPE merges found")
    special = {k: v for k, v in sv.special_token_ids.items() if k in _SPECIAL_KEYS}
    # without a BOS id llama.cpp's gpt2 default is token 11 (","): use Qwen's <|endoftext|>
    if "bos" not in special and "<|endoftext|>" in vocab:
        special["bos"] = vocab["<|endoftext|>"]
    tok_class = _AUTO_CLASSES.get(model_type or "") or _tokenizer_class(hf_dir)
    pre, normalizer = _pipeline(tj, tok_class)
    template = sv.chat_template
    if isinstance(template, list):  # named templates: keep the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    return Tokenizer(
        tokens=tokens,
        token_types=[int(t) for t in types],
        merges=list(sv.merges),
        pre=pre,
        special_ids=special,
        add_bos=sv.add_special_token.get("bos"),
        add_eos=sv.add_special_token.get("eos"),
        chat_template=template,
        normalizer=normalizer,
    )


def _tokenizer_class(hf_dir: Path) -> str | None:
    try:
        cfg = json.loads((Path(hf_dir) / "tokenizer_config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None  # SpecialVocab reads the same file; without it tokenizer.json rules
    return cfg.get("tokenizer_class")


def load_tokenizer(
    source: Tokenizer | str | Path, vocab_size: int, model_type: str | None = None
) -> Tokenizer:
    """A Tokenizer, an HF tokenizer folder, or a vocab-only .gguf file."""
    if isinstance(source, Tokenizer):
        tok = source
    elif Path(source).is_dir():
        tok = from_hf_dir(Path(source), vocab_size, model_type)
    elif Path(source).suffix == ".gguf":
        tok = from_vocab_gguf(Path(source))
    else:
        raise ConvertError(f"{source}: not a tokenizer folder or a vocab .gguf file")
    tok.check_vocab_size(vocab_size)
    return tok


def qwen_vocab_gguf() -> Path:
    """The Qwen vocab-only GGUF shipped in the pinned upstream sdist."""
    from pyqsa._build import upstream

    return upstream.fetch() / "vendor" / "llama.cpp" / "models" / "ggml-vocab-qwen35.gguf"
