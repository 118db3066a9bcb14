"""gguf_file (our fast reader) agrees with gguf.GGUFReader; the writer's output is valid GGUF."""

import gguf
import numpy as np
from gguf import GGMLQuantizationType as Q
from gguf import GGUFValueType as T
from pyqsa.convert.gguf_file import GGUFFile
from pyqsa.convert.writer import Item, write_gguf

KVS = [
    ("a.u8", 7, T.UINT8, None),
    ("a.i16", -3, T.INT16, None),
    ("a.f64", 0.125, T.FLOAT64, None),
    ("a.bool", True, T.BOOL, None),
    ("a.str", "héllo ✓", T.STRING, None),
    ("a.strs", ["x", "", "ĳ 🙂"], T.ARRAY, T.STRING),
    ("a.u64s", [2**40 + 1, 3], T.ARRAY, T.UINT64),
    ("a.bools", [True, False, True], T.ARRAY, T.BOOL),
    ("a.f32s", [1.5, -2.0], T.ARRAY, T.FLOAT32),
]


def test_reader_matches_gguf_reader(tmp_path):
    rng = np.random.default_rng(0)
    arrays = {
        "w.f32": rng.normal(size=(3, 5)).astype(np.float32),
        "w.f16": rng.normal(size=(4, 8)).astype(np.float32),
        "w.q8": rng.normal(size=(2, 64)).astype(np.float32),
    }
    qtypes = {"w.f32": Q.F32, "w.f16": Q.F16, "w.q8": Q.Q8_0}
    items = [
        Item(n, a.shape, qtypes[n], lambda a=a, q=qtypes[n]: iter([gguf.quants.quantize(a, q)]))
        for n, a in arrays.items()
    ]
    path = tmp_path / "t.gguf"
    write_gguf(path, KVS, items, progress=False)
    ours, ref = GGUFFile(path), gguf.GGUFReader(path)
    for key, value, _, _ in KVS:
        assert ours.get(key) == ref.fields[key].contents() == value
    assert ours.get("general.architecture") == "qwen4exp"
    ref_t = {t.name: t for t in ref.tensors}
    for t in ours.tensors:
        r = ref_t[t.name]
        assert t.qtype == r.tensor_type and list(t.ne) == [int(x) for x in r.shape]
        assert t.offset == r.data_offset
        assert ours.raw(t).tobytes() == np.asarray(r.data).tobytes()
    f = {t.name: ours.f32(t) for t in ours.tensors}
    np.testing.assert_array_equal(f["w.f32"], arrays["w.f32"])
    np.testing.assert_allclose(f["w.f16"], arrays["w.f16"], rtol=1e-3)
    np.testing.assert_allclose(f["w.q8"], arrays["w.q8"], atol=np.abs(arrays["w.q8"]).max() / 100)
