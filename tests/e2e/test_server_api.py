"""Chat and text completions through the real openai client: shapes, streaming, usage."""

from __future__ import annotations

import httpx

from pyqsa import native

MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi there<|im_end|>\n"
    "<|im_start|>assistant\n"
)


def test_models_and_health(server):
    client = server.openai()
    assert [m.id for m in client.models.list().data] == [server.model]
    assert client.models.retrieve(server.model).id == server.model
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["slots"] == 8


def test_chat_non_streaming_usage_matches_the_template(server, tokenizer):
    r = server.openai().chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=6, temperature=0
    )
    assert r.object == "chat.completion" and r.model == server.model
    (choice,) = r.choices
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    # the GGUF's template is Qwen ChatML: the prompt is exactly the rendered conversation
    assert r.usage.prompt_tokens == len(tokenizer.tokenize(CHATML))
    assert r.usage.completion_tokens == 6
    assert r.usage.total_tokens == r.usage.prompt_tokens + 6


def test_chat_streaming_matches_non_streaming(server):
    client = server.openai()
    whole = client.chat.completions.create(
        model=server.model, messages=MESSAGES, max_tokens=8, temperature=0
    )
    chunks = list(
        client.chat.completions.create(
            model=server.model,
            messages=MESSAGES,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "length" and set(finishes[:-1]) == {None}
    assert chunks[-1].choices == [] and chunks[-1].usage == whole.usage
    assert all(c.usage is None for c in chunks[:-1])


def test_stream_ends_with_done_and_no_usage_unless_asked(server):
    body = {
        "model": server.model,
        "messages": MESSAGES,
        "max_tokens": 3,
        "stream": True,
    }
    with httpx.stream(
        "POST", server.v1 + "/chat/completions", json=body, headers=server.headers()
    ) as r:
        assert r.status_code == 200
        assert r.headers["content-type"].startswith("text/event-stream")
        data = [line[6:] for line in r.iter_lines() if line.startswith("data: ")]
    assert data[-1] == "[DONE]"
    assert all('"usage"' not in d for d in data[:-1])


def test_completions_usage_and_logprobs(server, tokenizer):
    client = server.openai()
    prompt = "The capital of France is"
    r = client.completions.create(
        model=server.model, prompt=prompt, max_tokens=7, temperature=0, logprobs=2
    )
    (choice,) = r.choices
    assert r.object == "text_completion" and choice.finish_reason == "length"
    assert r.usage.prompt_tokens == len(tokenizer.tokenize(prompt))
    assert r.usage.completion_tokens == 7 == len(choice.logprobs.tokens)
    assert "".join(choice.logprobs.tokens) == choice.text
    assert all(len(top) == 2 for top in choice.logprobs.top_logprobs)
    # token ids in, the same completion out
    ids = tokenizer.tokenize(prompt)
    r2 = client.completions.create(model=server.model, prompt=ids, max_tokens=7, temperature=0)
    assert r2.choices[0].text == choice.text and r2.usage.prompt_tokens == len(ids)


def test_completions_streaming(server):
    client = server.openai()
    whole = client.completions.create(
        model=server.model, prompt="Once upon a time", max_tokens=10, temperature=0
    )
    chunks = list(
        client.completions.create(
            model=server.model,
            prompt="Once upon a time",
            max_tokens=10,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert "".join(c.choices[0].text for c in chunks if c.choices) == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.completion_tokens == 10


def test_seeded_sampling_repeats_and_stop_strings_cut(server):
    client = server.openai()

    def sample(seed):
        return (
            client.completions.create(
                model=server.model,
                prompt="abc",
                max_tokens=12,
                temperature=1.0,
                top_p=0.9,
                seed=seed,
            )
            .choices[0]
            .text
        )

    assert sample(7) == sample(7)
    assert sample(-7) == sample(-7)  # any integer seeds
    greedy = (
        client.completions.create(model=server.model, prompt="abc", max_tokens=12, temperature=0)
        .choices[0]
        .text
    )
    stop = greedy[3:6]  # a stop string inside the greedy text, likely across tokens
    cut = client.completions.create(
        model=server.model, prompt="abc", max_tokens=12, temperature=0, stop=[stop]
    )
    assert cut.choices[0].text == greedy[: greedy.index(stop)]
    assert cut.choices[0].finish_reason == "stop"


HOW = sorted(native.CUDA_GRAPH_FIELDS)


def test_metrics_count_the_passes_that_reused_their_graph(server):
    """Decode steps of one sequence keep the graph of the step before (llama.cpp builds none):
    /metrics counts them; the CUDA backend's graph computes appear only where it runs."""
    before = server.metrics().get("pyqsa_graph_reuses_total", 0.0)
    server.openai().completions.create(
        model=server.model, prompt="The quick brown fox", max_tokens=8, temperature=0
    )
    m = server.metrics()
    assert m["pyqsa_graph_reuses_total"] >= before + 5  # of the 7 steps after the first token
    cuda = sorted(k for k in m if k.startswith("pyqsa_cuda_graph_computes_total"))
    on_cuda = native.cuda_graph_counts() is not None  # this build has the CUDA backend
    assert cuda == (
        [f'pyqsa_cuda_graph_computes_total{{how="{h}"}}' for h in HOW] if on_cuda else []
    )
