"""GPU machine: the same GGUF run with every layer on CUDA and on the CPU, in one process without
torch; compares logits and QSA selections (CUDA kernels inside the real model graph).

    python3 tests/gpu/model_cuda_vs_cpu.py MODEL.gguf [n_tokens]
"""

import os
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".."))

from tests.parity.compare import rel_err, tokens  # noqa: E402
from tests.parity.llama_runtime import LlamaRuntime  # noqa: E402


def run(path: str, toks: list[int], gpu_layers: int, attn: str):
    os.environ["PYQSA_TEST_N_GPU_LAYERS"] = str(gpu_layers)
    rt = LlamaRuntime(path, n_ctx=1024, n_seq=1, attn=attn)
    logits = rt.decode([(0, toks, 0)])[0]
    sel = {il: np.concatenate([r[0] for r in rows]) for il, rows in rt.selections.rows.items()}
    rt.close()
    return logits, sel


def main() -> int:
    path = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 300
    toks = tokens(n, seed=1)
    ok = True
    for attn in ("positional", "sparse"):
        cpu, cpu_sel = run(path, toks, 0, attn)
        gpu, gpu_sel = run(path, toks, 999, attn)
        err = rel_err(gpu, cpu)
        top1 = float((gpu.argmax(-1) == cpu.argmax(-1)).mean())
        same_sel = bool(cpu_sel) and all(np.array_equal(cpu_sel[il], gpu_sel[il]) for il in cpu_sel)
        print(
            f"{path} ({attn}): {n} positions, CUDA vs CPU top-1 {top1:.2%}, max rel err "
            f"{err:.2e}, QSA selections identical: {same_sel} (layers {sorted(cpu_sel)})"
        )
        ok = ok and top1 == 1.0 and same_sel and err < 1e-3
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
