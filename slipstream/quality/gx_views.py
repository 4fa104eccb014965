"""GX Data Docs page views that share compiled Jinja templates across builds.

GX builds a new `SiteBuilder`, and with it new Jinja environments, for every Data Docs build;
each environment compiles the ~30 page templates again (~0.3-0.5 s of a ~0.5 s build). These
views are GX's own (`DefaultJinjaPageView`, `DefaultJinjaIndexPageView`) with an in-memory
bytecode cache shared by the process: a template is compiled once, and recompiled only if its
source changes (the cache is keyed by name and source checksum). The HTML is the same.
The gate's Data Docs site names them in its `view` settings (`suites.validate`).
"""

from __future__ import annotations

import threading
from typing import Any

from great_expectations.render.view.view import DefaultJinjaIndexPageView, DefaultJinjaPageView
from jinja2 import BytecodeCache
from jinja2.bccache import Bucket


class _MemoryBytecodeCache(BytecodeCache):
    """Compiled template code objects by (template key, source checksum), kept in memory."""

    def __init__(self) -> None:
        self._code: dict[str, tuple[str, Any]] = {}
        self._lock = threading.Lock()

    def load_bytecode(self, bucket: Bucket) -> None:
        with self._lock:
            hit = self._code.get(bucket.key)
        if hit is not None and hit[0] == bucket.checksum:
            bucket.code = hit[1]

    def dump_bytecode(self, bucket: Bucket) -> None:
        with self._lock:
            self._code[bucket.key] = (bucket.checksum, bucket.code)


TEMPLATE_CACHE = _MemoryBytecodeCache()


class CachedJinjaPageView(DefaultJinjaPageView):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = TEMPLATE_CACHE


class CachedJinjaIndexPageView(DefaultJinjaIndexPageView):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.env.bytecode_cache = TEMPLATE_CACHE
