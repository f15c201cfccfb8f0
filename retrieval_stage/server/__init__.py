"""``retrieval-stage serve`` as a library: the TEI-compatible rerank server (``[server]`` extra).

`create_app` returns the ASGI app (Starlette) for uvicorn or any ASGI server; `ServerSettings`
says what it serves and how it batches; `serve` runs it as ``retrieval-stage serve`` does.
It keeps the model (sentence-transformers and torch) out of the application's process: the
application talks to it with ``RerankClient(url)`` (TEI's shape) or ``provider="sidecar"``.
"""

from __future__ import annotations

from .._install import install_hint

try:
    import starlette  # noqa: F401
    import uvicorn  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on what is installed
    raise ImportError(
        f"retrieval_stage.server needs the [server] extra ({exc.name or exc} is missing): "
        f"{install_hint('server')}"
    ) from exc

from .app import create_app
from .run import serve
from .settings import ServerSettings

__all__ = ["ServerSettings", "create_app", "serve"]
