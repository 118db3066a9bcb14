"""Decode steps on the positional path reuse the previous step's graph, also across the steps
where a block completes: the precondition for the CUDA backend's captured graphs."""

import llama_cpp

from .compare import tokens
from .llama_runtime import LlamaRuntime


def test_decode_steps_reuse_the_graph_across_block_completions(tiny_gguf):
    rt = LlamaRuntime(str(tiny_gguf), n_ctx=512, n_seq=2)
    try:
        toks = tokens(104, seed=4)
        rt.decode([(0, toks[:40], 0), (1, toks[:40], 0)])
        before = llama_cpp.llama_perf_context(rt.ctx).n_reused
        steps = range(40, 104)  # 16 block completions (ratio 4), one KV size (n_kv padding 256)
        for p in steps:
            rt.decode([(0, [toks[p]], p), (1, [toks[p]], p)])
        reused = llama_cpp.llama_perf_context(rt.ctx).n_reused - before
    finally:
        rt.close()
    # only the first step builds a graph (its batch shape differs from the prefill's); before
    # the fixed completion slots, every step that completed a block and the step after it did
    assert reused == len(steps) - 1, f"{reused} of {len(steps)} decode steps reused the graph"
