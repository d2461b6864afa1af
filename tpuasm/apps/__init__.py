"""The paper's six production applications (Table 1) as programs for this machine.

    build(name) -> App                  the layer list (catalog.py; shapes in docs/apps.md)
    app_program(name, **shape)          .tasm for a machine shape: the app's QDQ ONNX model
                                        (onnx_models.py) compiled by tpuasm.compile, its
                                        segments joined (compiler/codegen/whole.py); cached on disk
    profile_main(argv)                  `tpuasm profile`: Table 3 next to the paper's
"""
from __future__ import annotations

from .catalog import PAPER_ORDER, build  # noqa: F401


def profile_main(argv: list[str] | None = None) -> int:
    from .cli import profile_main as _main
    return _main(argv)
