"""Keep numba's on-disk cache of the compiled engine in step with its sources.

numba's ``cache=True`` validates a cached function against its *own* source file only. The compiled
engine's entry points (``fast_engine``, ``fast_stream``) inline ``fast_replica`` and ``kv_cache``
functions, so after an edit to those files the entry points kept running the old code from the cache,
and the compiled and reference engines disagreed (docs/simulator.md). ``guard`` stamps the cache folder
with a digest of every source the compiled code is built from and empties the folder's numba files when
the digest changes: the next call recompiles (seconds) instead of running stale code.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterable
from pathlib import Path

HERE = Path(__file__).resolve().parent
SOURCES = ("fast_replica.py", "kv_cache.py", "fast_engine.py", "fast_stream.py", "results.py", "step_jitter.py")
"""The modules whose code ends up in the compiled engine (``results`` for its status codes, ``step_jitter`` for
the draw's constants)."""
STAMP = "leadscale-numba-sources.sha256"


def sources_digest(sources: Iterable[Path]) -> str:
    """One digest over the sources' names and bytes (a missing file counts as empty)."""
    h = hashlib.sha256()
    for path in sources:
        h.update(path.name.encode())
        with contextlib.suppress(OSError):  # a missing source hashes as its name alone
            h.update(path.read_bytes())
    return h.hexdigest()


def cache_folder() -> Path:
    """Where numba keeps this package's cache: under ``NUMBA_CACHE_DIR`` when set (numba's own sub-path
    rule), else ``__pycache__`` beside the sources."""
    from numba.core import caching, config

    if config.CACHE_DIR:
        subpath = str(caching.UserProvidedCacheLocator.get_suitable_cache_subpath(str(HERE / SOURCES[0])))
        return Path(str(config.CACHE_DIR)) / subpath
    return HERE / "__pycache__"


def guard(folder: Path | None = None, sources: Iterable[Path] | None = None) -> bool:
    """Empty ``folder`` of numba cache files (``*.nbi``, ``*.nbc``) unless its stamp matches the sources;
    returns True when it did. Never raises: a cache it cannot clean or stamp only costs a recompile later."""
    folder = cache_folder() if folder is None else folder
    digest = sources_digest(sources if sources is not None else (HERE / name for name in SOURCES))
    stamp = folder / STAMP
    try:
        if stamp.read_text().strip() == digest:
            return False
    except OSError:
        pass
    try:
        for stale in (*folder.glob("*.nbi"), *folder.glob("*.nbc")):
            stale.unlink(missing_ok=True)
        folder.mkdir(parents=True, exist_ok=True)
        stamp.write_text(digest + "\n")
    except OSError:
        return False
    return True
