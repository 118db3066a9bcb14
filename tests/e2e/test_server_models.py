"""The server on a model converted from an HF checkpoint by `pyqsa convert` (not the demo)."""

from __future__ import annotations

from conftest import THREADS, start_server, stop_server


def test_serves_a_converted_hf_checkpoint(tiny_gguf, cache_dir):
    s = start_server([str(tiny_gguf), "--slots", "2", "--ctx", "256", *THREADS], cache_dir)
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
