"""Draws under a grammar (pyqsa/engine/grammar.py) on the demo model's vocabulary: the grammar's
mask, and seeded draws from random rows that spell a sentence of it, the native sampler's and
the numpy reference's alike."""

from __future__ import annotations

import numpy as np
import pytest

from pyqsa.engine import GrammarError, SamplingParams
from pyqsa.engine.grammar import call_grammar, json_grammar
from pyqsa.engine.sampler import ReferenceSampler, Sampler

YES_NO = 'root ::= "yes" | "no"'


@pytest.fixture(scope="module")
def vocab(demo_llama):
    return demo_llama[1]


def test_the_mask_keeps_what_the_grammar_allows(vocab):
    g = vocab.grammar(YES_NO)
    x = np.random.default_rng(0).standard_normal(vocab.n_vocab).astype(np.float32)
    masked = g.mask(x)
    allowed = np.flatnonzero(np.isfinite(masked))
    assert 0 < len(allowed) < 50 and np.array_equal(masked[allowed], x[allowed])
    assert all(g.allows(int(t)) for t in allowed[:5])
    for t in allowed:  # every allowed token begins "yes" or "no"
        text = vocab.token_bytes(int(t)).decode()
        assert "yes".startswith(text) or "no".startswith(text), text
    assert not g.allows(vocab.eos)  # the sentence is not complete yet
    g.close()


def test_a_complete_sentence_allows_only_an_end(vocab):
    g = vocab.grammar(YES_NO)
    for t in vocab.tokenize("yes", special=False):
        assert g.allows(t)
        g.accept(t)
    assert g.allows(vocab.eos)
    assert not g.allows(vocab.tokenize("s", special=False)[0])
    g.close()


def test_a_grammar_that_does_not_parse(vocab):
    with pytest.raises(GrammarError):
        vocab.grammar("root ::= (")


def spell(vocab, sampler_type, params: SamplingParams, seed: int) -> list[int]:
    """Draws from random rows until an end token."""
    sampler = sampler_type(params, seed, vocab.grammar(params.grammar))
    rng = np.random.default_rng(seed)
    tokens: list[int] = []
    for _ in range(40):
        row = rng.standard_normal(vocab.n_vocab).astype(np.float32)
        token, _ = sampler(row, tokens, 0)
        tokens.append(token)
        if vocab.is_eog(token):
            break
    sampler.close()
    return tokens


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_seeded_draws_spell_a_sentence_of_the_grammar(vocab, seed, temperature):
    schema = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"]}
    params = SamplingParams(max_tokens=40, temperature=temperature, grammar=json_grammar(schema))
    tokens = spell(vocab, Sampler, params, seed)
    assert vocab.is_eog(tokens[-1])
    text = b"".join(vocab.token_bytes(t) for t in tokens[:-1]).decode()
    assert text.replace(" ", "") in ('{"a":"x"}', '{"a":"y"}'), text
    assert tokens == spell(vocab, ReferenceSampler, params, seed)


def test_a_call_grammar_takes_the_parameters_schemas(vocab):
    params = {"type": "object", "properties": {"u": {"enum": ["c"]}}, "required": ["u"]}
    text = call_grammar([("f", params), ("g", None)], named=False, close="</tool_call>")
    g = vocab.grammar(text)
    for t in vocab.tokenize(' "f", "arguments": {"u": "c"}}\n</tool_call>', special=True):
        assert g.allows(t), vocab.token_bytes(t)
        g.accept(t)
    assert g.allows(vocab.eos)
    g.close()
    with pytest.raises(ValueError):
        call_grammar([("f", {"not": {}})], named=True, close="</tool_call>")
