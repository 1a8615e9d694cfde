"""The guard that keeps numba's on-disk cache in step with the compiled engine's sources."""

from __future__ import annotations

from pathlib import Path

from simulator import numba_cache


def _cache(folder: Path) -> list[Path]:
    files = [folder / "fast_engine.run_loop-104.py311.nbi", folder / "fast_engine.run_loop-104.py311.1.nbc",
             folder / "fast_stream.drive-90.py311.nbi"]
    for f in files:
        f.write_bytes(b"compiled")
    return files


def test_a_changed_source_empties_the_cache_and_an_unchanged_one_keeps_it(tmp_path: Path) -> None:
    src, cache = tmp_path / "src", tmp_path / "__pycache__"
    src.mkdir()
    cache.mkdir()
    (src / "fast_replica.py").write_text("def f(): return 1\n")
    (src / "fast_engine.py").write_text("def g(): return f()\n")
    sources = sorted(src.glob("*.py"))
    other = cache / "fast_engine.cpython-311.pyc"
    other.write_bytes(b"bytecode")
    files = _cache(cache)
    assert numba_cache.guard(cache, sources)          # no stamp yet: whatever is cached is of unknown age
    assert not any(f.exists() for f in files) and other.exists()  # only numba's files go
    files = _cache(cache)
    assert not numba_cache.guard(cache, sources)      # stamped and unchanged: the cache stays
    assert all(f.exists() for f in files)
    (src / "fast_replica.py").write_text("def f(): return 2\n")  # the inlined callee changes, the caller not
    assert numba_cache.guard(cache, sources)
    assert not any(f.exists() for f in files)


def test_the_guard_never_raises_on_a_folder_it_cannot_write(tmp_path: Path) -> None:
    blocked = tmp_path / "file-not-folder"
    blocked.write_text("x")
    assert numba_cache.guard(blocked / "__pycache__", [tmp_path / "missing.py"]) is False


def test_the_package_cache_is_stamped_with_the_current_sources() -> None:
    import simulator.fast_replica  # noqa: F401  (importing runs the guard)

    stamp = numba_cache.cache_folder() / numba_cache.STAMP
    want = numba_cache.sources_digest(numba_cache.HERE / name for name in numba_cache.SOURCES)
    assert stamp.read_text().strip() == want
