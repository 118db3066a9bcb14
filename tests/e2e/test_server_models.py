"""The server on models converted from an HF checkpoint by `pyqsa convert` (not the demo), and
on one quantized by `pyqsa quantize --imatrix`."""

from __future__ import annotations

from conftest import THREADS, start_server, stop_server


def served_answers(path, cache_dir) -> None:
    """The file serves: its model is listed, and a greedy answer whole and streamed agree."""
    s = start_server([str(path), "--slots", "2", "--ctx", "256", *THREADS], cache_dir)
    try:
        client = s.openai()
        assert [m.id for m in client.models.list().data] == [s.model]
        messages = [{"role": "user", "content": "Hello"}]
        whole = client.chat.completions.create(
            model=s.model, messages=messages, max_tokens=5, temperature=0
        )
        assert whole.usage.completion_tokens == 5 and whole.choices[0].finish_reason == "length"
        chunks = client.chat.completions.create(
            model=s.model, messages=messages, max_tokens=5, temperature=0, stream=True
        )
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == whole.choices[0].message.content
    finally:
        stop_server(s)


def test_serves_a_converted_hf_checkpoint(tiny_gguf, cache_dir):
    served_answers(tiny_gguf, cache_dir)


def test_serves_a_file_quantized_with_an_importance_matrix(tiny_gguf, cache_dir, tmp_path):
    from pyqsa.convert.gguf_file import GGUFFile
    from pyqsa.convert.imatrix import compute_imatrix
    from pyqsa.convert.quantize import quantize

    (tmp_path / "text.txt").write_text(" ".join(f"sentence {i} of the text." for i in range(200)))
    imatrix = tmp_path / "imatrix.gguf"
    compute_imatrix(tiny_gguf, tmp_path / "text.txt", imatrix, chunk=64, progress=False)
    out = quantize(tiny_gguf, tmp_path / "q4.gguf", "Q4_K_M", imatrix=imatrix, progress=False)
    assert GGUFFile(out).get("quantize.imatrix.entries_count") > 100
    served_answers(out, cache_dir)
