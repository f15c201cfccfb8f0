"""Which reranker a command runs: `RerankSettings` built from the options and config's factory.

With an endpoint (or ``--provider local``) the reranker is whatever `make_reranker` makes of
the settings, as for a library user reading ``RERANK_*``; a refused value exits 2 naming its
option. Without an endpoint, ``--reranker`` picks the in-process cross-encoder (loaded now,
with a spinner) or the lexical fallback; ``auto`` takes the cross-encoder when it can load.
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.text import Text

from ..client import RerankClient
from ..config import LOCAL, RerankSettings, make_reranker
from ..errors import RerankError
from ..validate import InvalidSetting
from .console import COMPOSE_HINT, EXIT_FAILURE, EXIT_USAGE, err, fail, scrubbed, shown_url
from .options import OPTION_OF_FIELD, RerankerChoice, RerankOptions

__all__ = ["Chosen", "choose_reranker", "settings_of"]


@dataclass
class Chosen:
    """The reranker a command runs, how to describe it, and how to let it go."""

    reranker: Any
    label: str
    hint: str | None = None
    close: Callable[[], None] = field(default=lambda: None)

    @property
    def base_url(self) -> str | None:
        """The service's URL when the reranker is an HTTP client (to scrub from messages)."""
        base_url = getattr(self.reranker, "base_url", None)
        return base_url if isinstance(base_url, str) else None


def settings_of(options: RerankOptions) -> RerankSettings:
    """The options as `RerankSettings`, checked by its rules; exit 2 naming the option."""
    try:
        return RerankSettings(
            endpoint=options.endpoint or "",
            provider=options.provider,
            model=options.model,
            api_key=options.api_key,
            api_key_header=options.api_key_header or "",
            timeout=options.timeout,
            batch_size=options.batch_size,  # type: ignore[arg-type] # text: parsed there
        )
    except InvalidSetting as exc:
        option = OPTION_OF_FIELD.get(exc.field, exc.field)
        fail(EXIT_USAGE, f"{option}: {scrubbed(exc.reason, options.endpoint)}")


def choose_reranker(options: RerankOptions) -> Chosen:
    """An HTTP client for the endpoint; else the local cross-encoder or the lexical fallback."""
    settings = settings_of(options)
    choice = options.reranker
    if settings.endpoint:
        if choice is not RerankerChoice.auto:
            fail(EXIT_USAGE, f"--reranker {choice.value} cannot be combined with --endpoint")
        try:
            client = make_reranker(settings, strict=True)
        except (TypeError, ValueError) as exc:  # the client's own checks
            fail(EXIT_USAGE, scrubbed(str(exc), settings.endpoint))
        assert isinstance(client, RerankClient)
        shown = f" model {settings.model}" if settings.model else ""
        label = f"{settings.provider} at {shown_url(client.base_url)}{shown}"
        return Chosen(client, label, close=client.close)
    if settings.provider == LOCAL:
        choice = RerankerChoice.local
    if choice is RerankerChoice.lexical:
        return _lexical()
    return _local(dataclasses.replace(settings, provider=LOCAL), choice)


def _lexical(reason: str | None = None) -> Chosen:
    from ..local import DEFAULT_LOCAL_MODEL, INSTALL_HINT, LexicalReranker, local_available

    why = f"{reason}. " if reason else ""
    if local_available():  # the extra is there: only the model is missing
        how = (
            f"run once with network access to download {DEFAULT_LOCAL_MODEL}, pass "
            "--model DIR (a model directory)"
        )
    else:
        how = f"{INSTALL_HINT} to run {DEFAULT_LOCAL_MODEL} in process"
    return Chosen(
        LexicalReranker(),
        "lexical (bag-of-words term coverage and proximity; not a model)",
        hint=f"{why}For a real reranker: {how}, or {COMPOSE_HINT}.",
    )


def _hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hugging Face hub answers a TCP connect: a failed download retries for ~50s."""
    if os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on"):
        return False
    host = urlsplit(os.environ.get("HF_ENDPOINT") or "https://huggingface.co").hostname
    if not host:
        return False
    try:
        with socket.create_connection((host, 443), timeout=timeout):
            return True
    except OSError:
        return False


def _local(settings: RerankSettings, choice: RerankerChoice) -> Chosen:
    """The cross-encoder from config's factory, loaded now; under 'auto' any reason it cannot
    load means lexical."""
    from ..local import DEFAULT_LOCAL_MODEL, INSTALL_HINT, local_available, model_in_cache

    name = settings.model or DEFAULT_LOCAL_MODEL
    strict = choice is RerankerChoice.local
    if not local_available():
        if strict:
            fail(EXIT_USAGE, "--reranker local needs sentence-transformers", INSTALL_HINT)
        return _lexical("sentence-transformers is not installed")
    on_disk = Path(name).is_dir() or model_in_cache(name)
    if not on_disk and not _hub_reachable():
        reason = f"the model {name} is not downloaded and the Hugging Face hub is unreachable"
        if strict:
            fail(
                EXIT_FAILURE,
                reason,
                "download it once with network access, or pass --model DIR (a model "
                f"directory), or {COMPOSE_HINT}",
            )
        return _lexical(reason)
    reranker: Any = make_reranker(settings, strict=True)
    reranker.local_files_only = on_disk  # found on disk: never ask the hub
    try:
        with err().status(Text(f"loading {name}…")):
            reranker.load()
    except RerankError as exc:
        if strict:
            fail(EXIT_FAILURE, str(exc))
        return _lexical(f"the cross-encoder could not load ({exc})")
    return Chosen(reranker, f"local cross-encoder {reranker.model_name} (in process)")
