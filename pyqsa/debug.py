"""Read named intermediate tensors of a llama_decode through llama's cb_eval callback.

Used by the parity tests (QSA selections) and by calibration (K/V absmax). The graph names
its tensors "<name>-<layer>" (cb() in upstream's model graphs).
"""

from __future__ import annotations

import re
from collections.abc import Callable

import llama_cpp
import numpy as np

from . import native


class TensorCapture:
    """Calls on_tensor(name, array) for every computed tensor whose name matches pattern, and
    on_node(name) (when given) for every node of every graph the context computes.

    Give `cap.callback` to the context (`open_context(..., cb_eval=cap.callback)`); keep the
    object alive as long as the context lives (ctypes callbacks must not be garbage-collected).
    """

    def __init__(
        self,
        pattern: str,
        on_tensor: Callable[[str, np.ndarray], None],
        on_node: Callable[[str], None] | None = None,
    ):
        self._regex = re.compile(pattern)
        self._on_tensor = on_tensor
        self._on_node = on_node
        self._ffi, self._lib = native.raw()
        self.callback = llama_cpp.ggml_backend_sched_eval_callback(self._eval)
        self.error: BaseException | None = None

    def raise_pending(self) -> None:
        """Re-raise an exception from the callback (ctypes would otherwise only print it)."""
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def _view(self, t: int):
        view = self._ffi.new("pyqsa_tensor_view *")
        if self._lib.pyqsa_tensor_view_get(self._ffi.cast("void *", t), view) != 0:
            return None
        return view

    def _eval(self, t, ask, _user_data) -> bool:
        try:
            return self._handle(t, ask)
        except BaseException as e:  # noqa: BLE001 - re-raised by raise_pending()
            self.error = e
            return False  # stops the graph; llama_decode then fails

    def _handle(self, t, ask) -> bool:
        view = self._view(t)
        if view is None:
            return False
        name = self._ffi.string(view.name).decode()
        if ask and self._on_node is not None:
            self._on_node(name)
        if not self._regex.fullmatch(name):
            return not ask  # ask: we don't want it; after compute: keep going
        if ask:
            return True
        shape = tuple(int(view.ne[i]) for i in reversed(range(4)))
        out = np.empty(int(np.prod(shape)), dtype=np.float32)
        rc = self._lib.pyqsa_tensor_read_f32(
            self._ffi.cast("void *", t), self._ffi.cast("float *", out.ctypes.data), out.size
        )
        if rc != 0:
            raise native.NativeError(f"pyqsa_tensor_read_f32({name}) failed with code {rc}")
        self._on_tensor(name, out.reshape(shape))
        return True
