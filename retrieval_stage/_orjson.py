"""orjson where it is installed: a core dependency on CPython, absent where it has no wheel.

The JSON codec of the clients (`client.codec`) and the span's float formatting
(`spans.content.float_reprs`) use it where its output is exactly the standard library's, and
fall back to the standard library when this is None.
"""

from __future__ import annotations

from types import ModuleType

__all__ = ["ORJSON"]


def _orjson() -> ModuleType | None:
    try:
        import orjson
    except ImportError:  # pragma: no cover - an interpreter orjson has no wheel for (PyPy)
        return None
    return orjson


ORJSON = _orjson()
"""orjson, or None where it is not installed (the standard library then does it all)."""
