"""Token sampling: a request's draws (Sampler, with the native samplers) and their numpy
reference (draw, logprobs, ReferenceSampler).

Order (as in llama.cpp's default chain): logit bias, penalties, then greedy argmax or
temperature -> top_k -> min_p -> top_p -> a draw. The rules are those of
`pyqsa_sample_params` (native/include/pyqsa.h), which the native samplers (host:
native/ggml/sample-row.cpp; the device op: native/ggml/cuda/sample.cu) implement too:
ranks are (logit desc, id asc), so every cut is deterministic at ties, and the draw is
Gumbel-max with counter-based uniforms (`uniforms`): a token's noise depends only on the
request's seed, the draw's counter and the token id. The parameters are rounded to float32,
as the native samplers read them.

A seeded request samples the same tokens whatever else shares its batch, although batched
logits differ from a lone request's by ~1e-6: the draw is keyed by token id, so its result
moves only when such noise decides a near-tie between the two best candidates, or swaps
near-tied tokens at a cutoff and the swapped one wins. tests/unit/test_engine_sampler.py
measures it. Greedy picks the argmax, identical unless the two best logits are that close.
"""

from __future__ import annotations

import numpy as np

from .. import native
from ..native import SampleResult
from .grammar import Grammar
from .request import SamplingParams, TokenLogprob


def apply_penalties(
    logits: np.ndarray, params: SamplingParams, tokens: list[int], n_prompt: int
) -> np.ndarray:
    """Bias and penalize a copy of `logits`; `tokens` is prompt + output so far. Every step is
    float32, as the native samplers take it (pyqsa_logit_adjust): the bias, then the repetition
    penalty, then the frequency and presence penalties, rounded to float32 before they are
    subtracted."""
    x = np.array(logits, dtype=np.float32, copy=True)
    if params.logit_bias:
        ids = np.fromiter(params.logit_bias.keys(), dtype=np.int64)
        x[ids] += np.fromiter(params.logit_bias.values(), dtype=np.float32)
    if params.repetition_penalty != 1.0 and tokens:
        seen = np.unique(np.asarray(tokens, dtype=np.int64))
        v = x[seen]
        r = np.float32(params.repetition_penalty)
        x[seen] = np.where(v > 0, v / r, v * r)
    out = tokens[n_prompt:]
    if out and (params.presence_penalty or params.frequency_penalty):
        ids, counts = np.unique(np.asarray(out, dtype=np.int64), return_counts=True)
        x[ids] -= (params.frequency_penalty * counts + params.presence_penalty).astype(np.float32)
    return x


_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def _mix64(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer on uint64 (wrapping), as native/ggml/sample-rng.h."""
    z = z ^ (z >> np.uint64(30))
    z = z * np.uint64(0xBF58476D1CE4E5B9)
    z = z ^ (z >> np.uint64(27))
    z = z * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def draw_key(seed: int, counter: int) -> int:
    """The key of a request's draw number `counter` (its uniforms come from it)."""
    with np.errstate(over="ignore"):
        inner = _mix64(np.uint64(counter % 2**32) + _GOLDEN)
        return int(_mix64(np.uint64(seed % 2**64) + inner))


def uniforms(key: int, n: int) -> np.ndarray:
    """The draw's uniform in (0, 1) for every token id below n."""
    ids = np.arange(1, n + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        bits = _mix64(np.uint64(key) + ids * _GOLDEN) >> np.uint64(11)
    return (bits.astype(np.float64) + 0.5) * 2.0**-53


def _f32(v: float) -> float:
    return float(np.float32(v))


def draw(x: np.ndarray, params: SamplingParams, key: int) -> int:
    """Pick a token from penalized logits `x` (float32) with the draw's key."""
    if params.greedy:
        return int(np.argmax(x))  # ties: lowest token id
    # NOTE: Gumbel-max: the winner among the candidates of logit / T + G, with G a Gumbel
    # draw per token id, is a sample of softmax(logit / T) over them. The draws are per id,
    # so which tokens are candidates, and in which order, changes nothing else: noise moves
    # the result only when it changes the winner or drops it from the candidates. (A draw by
    # inverse CDF over candidates sorted by probability jumps whenever noise swaps two
    # near-equal tokens anywhere before the drawn one.)
    x = np.asarray(x, dtype=np.float32)
    u = uniforms(key, x.size)
    y = x.astype(np.float64) / _f32(params.temperature)
    idx = _candidates(x, y, params)
    if idx is None:
        return _gumbel_argmax(y, u)
    return int(idx[_gumbel_argmax(y[idx], u[idx])])


def _gumbel_argmax(y: np.ndarray, u: np.ndarray) -> int:
    """argmax of y - log(-log(u)) (the first on ties), the noise worked out only where it can win.

    The noise of every vocabulary entry (two logarithms each) was most of a 150K row's 6-8 ms
    (2-core CI machine). The winner scores at least what the highest logit scores, and at most
    its logit plus the row's largest noise, so only positions within that noise of the highest
    logit's score take part: a handful for peaked logits, all of them for a flat row (then the
    whole row). Same scores in the same order: the same winner as the expression over the whole
    row (tests/unit/test_engine_sampler.py)."""
    j = int(np.argmax(y))
    best = float(y[j] - np.log(-np.log(u[j])))
    g_max = float(-np.log(-np.log(u.max())))
    # the margin covers any rounding of the bound (1e-6 against scores of size ~50)
    keep = y >= best - g_max - 1e-6
    if np.count_nonzero(keep) > y.size // 4:  # a flat row: the whole row costs less than picking
        return int(np.argmax(y - np.log(-np.log(u))))
    can = np.flatnonzero(keep)
    return int(can[np.argmax(y[can] - np.log(-np.log(u[can])))])


def _ranked(x: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """`ids` in rank order: logit desc, id asc."""
    return ids[np.lexsort((ids, -x[ids]))]


def _candidates(x: np.ndarray, y: np.ndarray, params: SamplingParams) -> np.ndarray | None:
    """Token ids that survive top_k, min_p and top_p (None: every id); `x` the logits, `y` the
    tempered ones (the same order)."""
    top_p, min_p = _f32(params.top_p), _f32(params.min_p)
    if 0 < params.top_k < x.size:
        # the k best by rank: every id above the k-th logit, then its ties by lowest id
        kth = np.partition(x, x.size - params.top_k)[x.size - params.top_k]
        above = np.flatnonzero(x > kth)
        idx = np.concatenate([above, np.flatnonzero(x == kth)[: params.top_k - above.size]])
    elif min_p == 0 and top_p == 1:
        return None
    else:
        idx = np.arange(x.size)
    y_max = float(y.max())
    if min_p > 0:
        idx = idx[np.exp(y[idx] - y_max) >= min_p]
    if top_p < 1:
        idx = _top_p(x, y, idx, y_max, top_p)
    return idx


def _top_p(x: np.ndarray, y: np.ndarray, idx: np.ndarray, y_max: float, top_p: float) -> np.ndarray:
    """The shortest rank-order prefix of `idx` whose mass reaches top_p: an id stays while the
    mass ranked before it is below top_p of the whole."""
    # NOTE: sorting a 150K vocabulary costs ~30 ms per token; the nucleus is almost always
    # within the top few hundred, so rank a growing top-m (ties at its edge included) until it
    # holds the mass.
    p = np.exp(y[idx] - y_max)
    target = top_p * float(p.sum())
    m = min(256, idx.size)
    while True:
        edge = np.partition(x[idx], idx.size - m)[idx.size - m]
        part = _ranked(x, idx[x[idx] >= edge])
        mass = np.exp(y[part] - y_max)
        before = np.cumsum(mass) - mass
        keep = int(np.count_nonzero(before < target))
        if keep < part.size or part.size == idx.size:
            return part[:keep]
        m = min(m * 8, idx.size)


def logprobs(x: np.ndarray, token: int, n_top: int) -> TokenLogprob:
    """Log-probabilities under the penalized, untempered distribution."""
    x = x.astype(np.float64)
    m = x.max()
    lp = x - (m + np.log(np.exp(x - m).sum()))
    top: tuple[tuple[int, float], ...] = ()
    if n_top > 0:
        n_top = min(n_top, x.size)
        kth = np.partition(x, x.size - n_top)[x.size - n_top]
        idx = _ranked(x, np.flatnonzero(x >= kth))[:n_top]
        top = tuple((int(i), float(lp[i])) for i in idx)
    return TokenLogprob(token, float(lp[token]), top)


class Sampler:
    """Sampling state of one request: its seed and how many draws it has made. A draw runs in
    the sample op where the logits are (`device_draw` then `take`), or here on a logits row
    with the op's host kernel (pyqsa_sample, which releases the GIL, so the engine's rows draw
    in parallel); both follow this module's numpy reference (ReferenceSampler). The logit bias
    and penalties go to either as a list of logit adjustments (`adjustments`)."""

    def __init__(self, params: SamplingParams, seed: int, grammar: Grammar | None = None) -> None:
        self.params = params
        self.grammar = grammar
        # any integer is a valid seed (OpenAI takes negative ones): its low 64 bits
        self.seed = (params.seed if params.seed is not None else seed) % 2**64
        self.counter = 0
        # adjustments(): the rows so far and each row's output count, and how many output tokens
        # they hold
        self._adjust: tuple[np.ndarray, np.ndarray] | None = None
        self._folded = 0

    def __call__(
        self, logits: np.ndarray, tokens: list[int], n_prompt: int
    ) -> tuple[int, TokenLogprob | None]:
        """Draw from a logits row; `tokens` is prompt + output so far (for the penalties). With a
        grammar, a token it rejects is drawn again from the row masked to what it allows (see
        pyqsa/engine/grammar.py)."""
        token, lp = self._draw(logits, tokens, n_prompt)
        if self.grammar is not None:
            if not self.grammar.allows(token):
                token, lp = self._draw(self.grammar.mask(logits), tokens, n_prompt)
                if not self.grammar.allows(token):
                    raise ValueError("the grammar allows no token here")
            self.grammar.accept(token)
        self.counter += 1
        return token, lp

    def _draw(
        self, logits: np.ndarray, tokens: list[int], n_prompt: int
    ) -> tuple[int, TokenLogprob | None]:
        """The next draw from a row, the counter left as it is."""
        adjust = self.adjustments(len(logits), tokens, n_prompt)
        return self._token(native.sample(logits, adjust=adjust, **self._params()))

    def close(self) -> None:
        if self.grammar is not None:
            self.grammar.close()

    def adjustments(self, n_vocab: int, tokens: list[int], n_prompt: int) -> np.ndarray | None:
        """The next draw's logit bias and penalties as pyqsa_logit_adjust rows (int32 [n, 4]:
        id, then bias, repetition penalty and subtrahend as float32 bits, ids ascending), None
        when it has none; `tokens` is this request's prompt + output so far, which only grows
        between calls. ValueError for a logit_bias id outside the vocabulary.

        NOTE: the rows are kept and each call folds in only the tokens output since the last
        one (a draw adds one): rebuilding them from all the output each step, host time before
        every forward pass, cost 380-554 us a step for 8 penalized requests over 300 output
        tokens (and grew with the output), 55-131 us now (a CPU machine, 8b73c90)."""
        p = self.params
        rep = p.repetition_penalty != 1.0
        pen = bool(p.presence_penalty or p.frequency_penalty)
        if not (p.logit_bias or rep or pen):
            return None
        if self._adjust is None:
            self._adjust = self._base_adjustments(n_vocab, tokens[:n_prompt], rep)
        if rep or pen:
            for t in tokens[n_prompt + self._folded :]:
                self._fold(t, rep, pen)
            self._folded = len(tokens) - n_prompt
        rows, _ = self._adjust
        return rows.copy() if len(rows) else None

    def _base_adjustments(
        self, n_vocab: int, prompt: list[int], rep: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """The rows before any output (the logit bias; with a repetition penalty, every prompt
        id) and each row's output count (0)."""
        p = self.params
        bias_ids = np.fromiter(p.logit_bias.keys(), dtype=np.int64, count=len(p.logit_bias))
        if bias_ids.size and not (0 <= bias_ids.min() and bias_ids.max() < n_vocab):
            raise ValueError(f"logit_bias: token ids must be below {n_vocab}")
        seen = np.unique(np.asarray(prompt, dtype=np.int64)) if rep else np.zeros(0, np.int64)
        ids = np.union1d(bias_ids, seen)
        table = np.zeros((ids.size, 4), np.float32)
        table[:, 2] = 1.0
        if bias_ids.size:
            bias = np.fromiter(p.logit_bias.values(), dtype=np.float32, count=bias_ids.size)
            table[np.searchsorted(ids, bias_ids), 1] = bias
        if rep:
            table[np.searchsorted(ids, seen), 2] = np.float32(p.repetition_penalty)
        rows = table.view(np.int32)
        rows[:, 0] = ids
        return rows, np.zeros(ids.size, np.int64)

    def _fold(self, token: int, rep: bool, pen: bool) -> None:
        """One more output token: its row gets the repetition penalty and, with the frequency
        or presence penalty, the subtrahend of its new count (a row of its own if new)."""
        p = self.params
        rows, counts = self._adjust
        i = int(np.searchsorted(rows[:, 0], token))
        if i == len(rows) or rows[i, 0] != token:
            one = np.zeros(4, np.float32)
            one[2] = 1.0
            row = one.view(np.int32)
            row[0] = token
            rows = np.concatenate((rows[:i], row[None], rows[i:]))
            counts = np.concatenate((counts[:i], [0], counts[i:]))
        counts[i] += 1
        values = rows.view(np.float32)
        if rep:
            values[i, 2] = np.float32(p.repetition_penalty)
        if pen:
            values[i, 3] = np.float32(p.frequency_penalty * counts[i] + p.presence_penalty)
        self._adjust = rows, counts

    def device_draw(
        self, n_vocab: int, tokens: list[int], n_prompt: int, max_adjust: int
    ) -> dict | None:
        """The next draw's parameters and logit adjustments (native.DeviceSampler.set), or
        None when it cannot run where the logits are: a grammar, more than `max_adjust`
        adjustments, or parameters only the host path reports as wrong."""
        if self.grammar is not None:
            return None
        try:
            adjust = self.adjustments(n_vocab, tokens, n_prompt)
        except ValueError:
            return None
        if adjust is not None and len(adjust) > max_adjust:
            return None
        return {**self._params(), "adjust": adjust}

    def _params(self) -> dict:
        """The next draw's pyqsa_sample_params (native._sample_params' keywords)."""
        p = self.params
        return {
            "temperature": 0.0 if p.greedy else p.temperature,
            "top_k": p.top_k,
            "top_p": p.top_p,
            "min_p": p.min_p,
            "seed": self.seed,
            "counter": self.counter,
            "n_top": -1 if p.logprobs is None else p.logprobs,
        }

    def take(self, drawn: SampleResult) -> tuple[int, TokenLogprob | None]:
        """Accept a draw made with the next draw's parameters (device_draw)."""
        self.counter += 1
        return self._token(drawn)

    def _token(self, drawn: SampleResult) -> tuple[int, TokenLogprob | None]:
        if self.params.logprobs is None:
            return drawn.token, None
        return drawn.token, TokenLogprob(drawn.token, drawn.logprob, drawn.top)

    def next_token(
        self, row: np.ndarray | SampleResult, tokens: list[int], n_prompt: int
    ) -> tuple[int, TokenLogprob | None]:
        """The next token from a forward pass's output row: a draw made where the logits are
        (runner.run given device_draw's parameters) taken, or one drawn here from logits."""
        if isinstance(row, SampleResult):
            return self.take(row)
        return self(row, tokens, n_prompt)


class ReferenceSampler(Sampler):
    """The same draws with this module's numpy functions: the reference the native samplers
    are tested against."""

    def _draw(
        self, logits: np.ndarray, tokens: list[int], n_prompt: int
    ) -> tuple[int, TokenLogprob | None]:
        x = apply_penalties(logits, self.params, tokens, n_prompt)
        token = draw(x, self.params, draw_key(self.seed, self.counter))
        lp = None if self.params.logprobs is None else logprobs(x, token, self.params.logprobs)
        return token, lp
