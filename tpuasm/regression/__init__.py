"""The regression runner: `test.toml` manifests, their runner, reports and `tpuasm test`.

    main(argv) -> int          the `tpuasm test` command (exit 0 pass, 1 fail, 2 usage)
    load_manifest(path)        parse and validate one manifest (spec/regression.md)
    run_manifest(manifest)     run it in this process -> Result

Importing this package is cheap: the machine and assembler are imported only when a
program runs.
"""
from __future__ import annotations


def main(argv: list[str] | None = None) -> int:
    from .cli import main as _main
    return _main(argv)


def __getattr__(name):
    if name in ("load_manifest", "Manifest", "ManifestError", "discover"):
        from . import manifest
        return getattr(manifest, name)
    if name in ("run_manifest", "Result"):
        from . import runner
        return getattr(runner, name)
    raise AttributeError(f"module 'tpuasm.regression' has no attribute {name!r}")
