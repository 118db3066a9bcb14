"""The GGUF's embedded tokenizer tokenizes exactly as the HF tokenizer it came from.

HF's Qwen tokenizers NFC-normalise; llama.cpp's BPE cannot, so the GGUF carries
pyqsa.tokenizer.normalizer = "NFC" and pyqsa normalises before llama_tokenize.
"""

import ctypes
import unicodedata

import pytest
from pyqsa.convert import from_hf_dir, from_vocab_gguf, qwen_vocab_gguf
from pyqsa.convert.gguf_file import GGUFFile

TEXTS = [
    "Hello, world! This is a test.",
    "The quick brown fox jumps over the lazy dog 1234567890 times.",
    "你好，世界！今天天气很好。",
    "日本語のテキストと한국어 텍스트",
    "emoji: 🙂🚀👩‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "def f(x):\n    return {'a': [x, x ** 2]}  # comment\n\tif x != 0: pass",
    "whitespace   runs\t\t\tand\n\n\n\nnewlines  \r\n  trailing   ",
    "combining marks: e\u0301 a\u0300 n\u0303 o\u0308 \u0915\u093f \u0e01\u0e34",
    "marks without a precomposed form: q\u0301 x\u0308\u0323 \u0915\u094d\u0937",
    "Ünïcödé ñ ß ø Å ŀ ĳ",
    "   leading spaces and 'quotes' it's we're they'll I'd",
    "<|im_start|>user\nhi there<|im_end|>\n<|im_start|>assistant\n",
    "",
]


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_hf_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(tiny_hf_dir))


@pytest.fixture(scope="module")
def runtime_vocab(tiny_gguf):
    import llama_cpp as L

    L.llama_backend_init()
    params = L.llama_model_default_params()
    params.vocab_only = True
    model = L.llama_model_load_from_file(str(tiny_gguf).encode(), params)
    assert model
    yield L, L.llama_model_get_vocab(model)
    L.llama_model_free(model)


def llama_tokenize(runtime_vocab, text: str) -> list[int]:
    L, vocab = runtime_vocab
    data = text.encode("utf-8")
    cap = len(data) + 8
    buf = (L.llama_token * cap)()
    n = L.llama_tokenize(vocab, data, len(data), buf, cap, False, True)
    assert n >= 0
    return list(buf[:n])


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_upstream_tokenizes_like_hf(hf_tokenizer, runtime_vocab, text):
    nfc = unicodedata.normalize("NFC", text)
    assert llama_tokenize(runtime_vocab, nfc) == hf_tokenizer.encode(text, add_special_tokens=False)
    if nfc == text:  # already normalised: no help from pyqsa needed at all
        assert llama_tokenize(runtime_vocab, text) == hf_tokenizer.encode(
            text, add_special_tokens=False
        )


def test_metadata(tiny_gguf, hf_tokenizer):
    g = GGUFFile(tiny_gguf)
    assert g.get("tokenizer.ggml.model") == "gpt2"
    assert g.get("tokenizer.ggml.pre") == "qwen35"  # the class's split regex (marks included)
    assert g.get("pyqsa.tokenizer.normalizer") == "NFC"
    assert g.get("tokenizer.chat_template") == hf_tokenizer.chat_template
    assert g.get("tokenizer.ggml.eos_token_id") == hf_tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert g.get("tokenizer.ggml.bos_token_id") == 151643  # not llama.cpp's gpt2 default 11
    assert g.get("tokenizer.ggml.add_bos_token") is False
    types = g.get("tokenizer.ggml.token_type")
    assert len(types) == 151936 and types[151644] == 3 and types[151700] == 5


def test_hf_dir_and_vocab_gguf_agree(tiny_hf_dir):
    """The rebuilt HF folder and the vocab GGUF it came from give the same vocabulary."""
    a, b = from_hf_dir(tiny_hf_dir, 151936), from_vocab_gguf(qwen_vocab_gguf())
    assert a.merges == b.merges
    assert a.tokens[:151646] == b.tokens[:151646]
    assert a.pre == b.pre == "qwen35"
    assert a.chat_template == b.chat_template


def test_runtime_detokenizes(runtime_vocab):
    L, vocab = runtime_vocab
    text = "你好 🙂 code()"
    out = b""
    for t in llama_tokenize(runtime_vocab, text):
        buf = ctypes.create_string_buffer(64)
        n = L.llama_token_to_piece(vocab, t, buf, 64, 0, False)
        out += buf.raw[:n]
    assert out.decode("utf-8") == text


@pytest.fixture(scope="module")
def engine_model(tiny_gguf):
    from pyqsa.engine.runner import LlamaModel

    return LlamaModel(str(tiny_gguf))


@pytest.mark.parametrize("text", TEXTS, ids=range(len(TEXTS)))
def test_engine_tokenizes_like_hf(hf_tokenizer, engine_model, text):
    """What the server sends to the model: the engine applies the file's NFC itself."""
    assert engine_model.normalizer == "NFC"
    assert engine_model.tokenize(text) == hf_tokenizer.encode(text, add_special_tokens=False)
