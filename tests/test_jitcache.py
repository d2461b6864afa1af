"""The numba cache directory follows the sources the compiled core depends on."""
import os

from tpuasm.machine import jitcache


def _fake_package(tmp_path):
    (tmp_path / "machine").mkdir()
    (tmp_path / "machine" / "kernels.py").write_text("x = 1\n")
    (tmp_path / "functions.py").write_text("t = 2\n")
    (tmp_path / "cli.py").write_text("# not compiled\n")
    return tmp_path


def test_digest_changes_with_any_compiled_dependency(tmp_path, monkeypatch):
    monkeypatch.setattr(jitcache, "_PACKAGE", _fake_package(tmp_path))
    first = jitcache.source_digest()
    assert jitcache.source_digest() == first
    (tmp_path / "cli.py").write_text("# edited, still not compiled\n")
    assert jitcache.source_digest() == first
    (tmp_path / "machine" / "kernels.py").write_text("x = 3\n")
    assert jitcache.source_digest() != first


def test_cache_dir_is_set_only_inside_the_block_and_old_generations_are_pruned(tmp_path, monkeypatch):
    from numba.core import config
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for k in range(6):
        old = tmp_path / "tpuasm" / f"numba-old{k}"
        old.mkdir(parents=True)
        os.utime(old, (k, k))
    before = config.CACHE_DIR
    with jitcache.keyed_cache_dir():
        inside = config.CACHE_DIR
    assert config.CACHE_DIR == before
    assert inside.startswith(str(tmp_path / "tpuasm" / "numba-"))
    kept = sorted(p.name for p in (tmp_path / "tpuasm").iterdir())
    assert len(kept) == jitcache._KEEP and os.path.basename(inside) in kept


def test_user_setting_wins(monkeypatch):
    from numba.core import config
    monkeypatch.setenv("NUMBA_CACHE_DIR", "/somewhere/else")
    before = config.CACHE_DIR
    with jitcache.keyed_cache_dir():
        assert config.CACHE_DIR == before
