"""`pyqsa inspect --slots N --ctx C`: device bytes of a GGUF served as `pyqsa serve` would.

The QSA K/V arithmetic is pyqsa.engine.paging's (the one serve plans with): all of it on the
device without paging; with paging it moves to the host store and the device keeps the hot
cache of `hot_blocks` blocks per slot and QSA layer. Not counted: recurrent (GDN) state,
indexer keys, the tail ring and compute buffers, which do not depend on the weights' type.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class ServeMemory:
    slots: int
    ctx: int
    kv_type: str
    weights: int
    kv: int  # QSA K/V of slots x ctx tokens
    hot_blocks: int  # per slot and QSA layer, with paging
    hot: int  # the hot caches' bytes

    @property
    def device_unpaged(self) -> int:
        return self.weights + self.kv

    @property
    def device_paged(self) -> int:
        return self.weights + self.hot

    def to_dict(self) -> dict:
        return {
            **asdict(self),
            "device_unpaged": self.device_unpaged,
            "device_paged": self.device_paged,
        }


def serve_memory(path: str | Path, weights: int, slots: int, ctx: int, kv_type: str) -> ServeMemory:
    from pyqsa.engine.paging import PagingError, QsaKv

    from .errors import ConvertError

    try:
        kv = QsaKv.from_gguf(path)
    except PagingError as e:
        raise ConvertError(str(e)) from None
    hot_blocks = kv.default_hot_blocks
    return ServeMemory(
        slots=slots,
        ctx=ctx,
        kv_type=kv_type,
        weights=weights,
        kv=kv.kv_bytes(kv_type, slots * ctx),
        hot_blocks=hot_blocks,
        hot=kv.kv_bytes(kv_type, slots * hot_blocks * kv.ratio),
    )


def render_memory(m: ServeMemory) -> str:
    from .inspect import size_text

    return "\n".join(
        [
            f"serve --slots {m.slots} --ctx {m.ctx} --kv-type {m.kv_type} (device, weights + "
            "QSA K/V; GDN state, indexer keys and compute buffers not counted):",
            f"  unpaged: {size_text(m.device_unpaged)} (K/V {size_text(m.kv)})",
            f"  paged:   {size_text(m.device_paged)} (hot cache {m.hot_blocks} blocks a slot "
            f"and layer, {size_text(m.hot)}; K/V {size_text(m.kv)} in host memory)",
        ]
    )
