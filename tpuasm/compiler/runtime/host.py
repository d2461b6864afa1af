"""The host parts of a compiled model at run time: each an onnxruntime session over its
sub-model (cut by front/hostparts.py), opened on first use."""
from __future__ import annotations

import numpy as np

from tpuasm.compiler.errors import CompileError
from tpuasm.compiler.ort import session


class HostRunner:
    """One host part: an onnxruntime session over its sub-model, opened on first use."""

    def __init__(self, model_bytes: bytes, inputs: list[str], outputs: list[str], name: str):
        self.model_bytes = model_bytes
        self.inputs, self.outputs, self.name = inputs, outputs, name
        self._session = None

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        try:
            if self._session is None:
                self._session = session(self.model_bytes)
            results = self._session.run(self.outputs, {k: feeds[k] for k in self.inputs})
        except Exception as e:        # onnxruntime's errors have no common public base
            text = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
            raise CompileError(f"host part {self.name}: onnxruntime failed: {text}") from None
        return dict(zip(self.outputs, results))
