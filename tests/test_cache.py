"""tpuasm.cache: one root for every cache, content keys, atomic file entries, pruning."""
from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import tpuasm
from tpuasm import cache

ROOT = Path(tpuasm.__file__).resolve().parent


def test_every_cache_lives_under_the_one_root(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    from tpuasm.apps.programs import cache_dir
    from tpuasm.machine import aot, jitcache, native
    from tpuasm.sweep.cache import default_path
    base = tmp_path / "tpuasm"
    assert cache.root() == base == jitcache.cache_root()
    assert cache_dir() == base / "apps"
    assert default_path() == base / "sweep-results.sqlite"
    assert aot.directory().parent == base and aot.directory().name.startswith("aot-")
    assert native.directory().parent == base and native.directory().name.startswith("native-")


def test_the_root_is_computed_in_one_place():
    # "~/.cache" (XDG's default) is spelled once, in tpuasm/cache.py
    spelled = [p.relative_to(ROOT).as_posix() for p in ROOT.rglob("*.py")
               if re.search(r"""["']\.cache["']""", p.read_text("utf-8"))]
    assert spelled == ["cache.py"]


def test_keys_follow_the_content():
    assert cache.key("a", {"x": 1, "y": 2}) == cache.key("a", {"y": 2, "x": 1})
    assert cache.key("a", 1) != cache.key("a", 2)
    assert len(cache.key("a")) == 16 and len(cache.key("a", length=24)) == 24
    assert cache.entry("aot", "abc").name == "aot-abc"


def test_a_file_entry_is_whole_or_the_old_one(tmp_path, monkeypatch):
    target = tmp_path / "sub" / "program-1.json"
    cache.write_file(target, "old")
    assert target.read_text() == "old"

    def fail(*args):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(OSError):
        cache.write_file(target, "new" * 1000)
    assert target.read_text() == "old"
    assert sorted(p.name for p in target.parent.iterdir()) == ["program-1.json"]


def test_build_once_installs_and_a_failure_is_noted(tmp_path):
    where = tmp_path / "native-k1"

    def build(w):
        tmp = cache.staging_directory(w)
        (tmp / "lib.so").write_text("built")
        cache.install(tmp, w, "native-")
    assert cache.ensure_built(where, where / "lib.so", build)
    assert (where / "lib.so").read_text() == "built"
    assert [p.name for p in tmp_path.iterdir()] == ["native-k1"]    # no lock, no staging
    broken = tmp_path / "native-k2"
    with pytest.warns(RuntimeWarning, match="falls back"):
        cache.note_failure(broken, OSError("no compiler"), "falls back")
    assert not cache.ensure_built(broken, broken / "lib.so", build)


def test_old_generations_are_pruned_recent_ones_kept(tmp_path):
    for k in range(cache.KEEP + 3):
        d = tmp_path / f"aot-old{k}"
        d.mkdir()
        os.utime(d, (k, k))
    recent = tmp_path / "aot-recent"
    recent.mkdir()
    current = tmp_path / "aot-now"
    current.mkdir()
    cache.prune(current, "aot-")
    left = {p.name for p in tmp_path.iterdir()}
    assert {"aot-now", "aot-recent"} <= left and len(left) == cache.KEEP
