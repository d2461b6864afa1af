"""pytest plugin: every `test.toml` regression manifest is a test item.

Registered in pyproject.toml (entry point `pytest11`), so `pytest` and `make test`
collect programs/**/test.toml next to the ordinary tests; `-k` selects by program
name or tag, and pytest-xdist spreads them over workers.  Only files named
test.toml are touched, and everything heavy (numpy, the assembler, the machine) is
imported when an item runs, never when the plugin is loaded.
"""
from __future__ import annotations

import pytest

MANIFEST_NAME = "test.toml"      # tpuasm.regression.manifest.MANIFEST_NAME, without the import


def pytest_collect_file(file_path, parent):
    if file_path.name == MANIFEST_NAME and not _in_generated_dir(file_path, parent.config.rootpath):
        return ManifestFile.from_parent(parent, path=file_path)
    return None


def _in_generated_dir(path, root) -> bool:
    """Generated data (`data/`, `out/`) is never a test, whatever it contains."""
    try:
        parts = path.relative_to(root).parts[:-1]
    except ValueError:
        parts = path.parts[-3:-1]
    return any(p in ("data", "out") for p in parts)


class ManifestFile(pytest.File):
    def collect(self):
        from tpuasm.regression.manifest import ManifestError, load_manifest
        try:
            manifest = load_manifest(self.path)
        except ManifestError as e:
            raise self.CollectError(str(e)) from None
        yield ManifestItem.from_parent(self, name=manifest.name, manifest=manifest)


class ManifestFailed(Exception):
    def __init__(self, result):
        super().__init__(result.name)
        self.result = result


class ManifestItem(pytest.Item):
    def __init__(self, *, manifest, **kwargs):
        super().__init__(**kwargs)
        self.manifest = manifest
        registered = {line.split(":")[0].split("(")[0].strip()
                      for line in self.config.getini("markers")}
        for tag in manifest.tags:
            if tag in registered:
                self.add_marker(tag)            # e.g. `slow`, so `-m "not slow"` works
            self.extra_keyword_matches.add(tag)  # and -k matches any tag

    def runtest(self):
        from tpuasm.regression.runner import run_manifest
        result = run_manifest(self.manifest)
        self.user_properties.append(("cycles", result.cycles))
        if not result.passed:
            raise ManifestFailed(result)

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, ManifestFailed):
            from tpuasm.regression.report import failure_text
            return failure_text(excinfo.value.result)
        return super().repr_failure(excinfo, style=style)

    def reportinfo(self):
        return self.path, None, f"program {self.manifest.name}"
