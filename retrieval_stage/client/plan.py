"""What a rerank call reads of its client: a frozen `Plan` and the shared `Learned` state.

The flow never reaches into the client. `Plan` holds the client's configuration, fixed when the
client is made (wire format, endpoint, key, deadline, retries); `Learned` holds the little a
server teaches that every later call should use (the batch cap TEI's ``/info`` or a refusal
states, the model it reports), behind a lock because concurrent calls share it.
"""

from __future__ import annotations

import base64
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry import propagate, trace

from .._log import get_logger
from .._redact import without_key
from ..spans.handoff import mark_handoff
from .body import ACCEPT_ENCODING, DEFAULT_MAX_RESPONSE_BYTES
from .providers import WireFormat

__all__ = ["Learned", "Plan"]

log = get_logger("retrieval_stage.client")


@dataclass(frozen=True, slots=True)
class Plan:
    """A client's configuration as every call of it sees it."""

    format: WireFormat
    base_url: str
    model: str | None
    api_key: str | None
    api_key_header: str
    timeout: float
    max_retries: int
    random: Callable[[], float]
    clock: Callable[[], float]
    max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES
    send_baggage: bool = True
    basic_auth: str | None = None
    """``user:password`` from the endpoint URL, sent as ``Authorization: Basic`` (never left
    in the URL, where any library's log line of the request would print it)."""

    def __repr__(self) -> str:  # the key must not reach a repr
        return f"Plan(provider={self.provider!r}, model={self.model!r})"

    @property
    def provider(self) -> str:
        return self.format.name

    def headers(self) -> dict[str, str]:
        """Request headers: accept, the encodings we can decode within `max_response_bytes`
        (``Accept-Encoding``, so a server never picks one we cannot bound), the key, URL
        credentials as Basic auth, and W3C trace context from the global propagator
        (``traceparent``, ``tracestate`` and, unless `send_baggage` is off, the application's
        ``baggage``), so a traced server joins our trace. Inside our own recording, sampled
        RERANKER span that something will export, ``x-rstage-reranker`` names that span
        (`retrieval_stage.spans.handoff`), so ``retrieval-stage serve`` does not write a second
        RERANKER span for the same rerank."""
        headers = {"accept": "application/json", "accept-encoding": ACCEPT_ENCODING}
        if self.basic_auth is not None:
            token = base64.b64encode(self.basic_auth.encode()).decode("ascii")
            headers["Authorization"] = f"Basic {token}"
        if self.api_key:
            if self.api_key_header.lower() == "authorization":
                headers["Authorization"] = f"Bearer {self.api_key}"
            else:
                headers[self.api_key_header] = self.api_key
        propagate.inject(headers)
        mark_handoff(headers, trace.get_current_span())
        if not self.send_baggage:
            headers.pop("baggage", None)
        return headers

    @property
    def secrets(self) -> list[str]:
        """Everything a server must never get back into our text: the key, URL credentials."""
        found = [self.api_key] if self.api_key else []
        if self.basic_auth is not None:
            user, _, password = self.basic_auth.partition(":")
            token = base64.b64encode(self.basic_auth.encode()).decode("ascii")
            found += [s for s in (password, token) if len(s) >= 3]
            if not password and len(user) >= 3:  # a token given as the username
                found.append(user)
        return found

    def redact(self, text: str) -> str:
        """`text` with the key replaced: for messages built from a transport error."""
        for secret in self.secrets:
            text = without_key(text, secret)
        return text


class Learned:
    """What the server taught one client, shared by all its calls."""

    def __init__(self, batch_size: int, *, ask_info: bool, ask_model: bool = False) -> None:
        self._size = batch_size
        self._cap: int | None = None
        self.model: str | None = None
        self.ask_info = ask_info
        # TEI names its model only in ``/info``: with no model configured, one call asks it
        # (once per client, whatever the answer), so spans and metrics carry a model name.
        self._ask_model = ask_model
        self._lock = threading.Lock()

    @property
    def batch_size(self) -> int:
        """Texts per request now: the configured (or ``/info``) size, lowered by a stated cap."""
        return self._size if self._cap is None else min(self._size, self._cap)

    def take_model_question(self) -> bool:
        """Whether this call is the one to ask ``/info`` for the model (at most one per client,
        also when calls start concurrently)."""
        with self._lock:
            ask, self._ask_model = self._ask_model, False
        return ask

    def apply_info(
        self, info: Any, clean: Callable[[str], str | None], *, batch: bool = True
    ) -> str | None:
        """Take the model and, with `batch`, the batch cap from TEI's ``/info``; what was
        missing, else None. Without `batch` the configured batch size is kept.

        The model id is server text: `clean` (the flow's sanitiser, which also caps it) is
        applied before it is kept, since it reaches spans and responses."""
        if not isinstance(info, dict):
            return "not a JSON object"
        model_id = info.get("model_id")
        if isinstance(model_id, str) and model_id:
            self.model = clean(model_id) or None
        if not batch:
            return None if self.model else "no model_id"
        cap = info.get("max_client_batch_size")
        if isinstance(cap, int) and not isinstance(cap, bool) and cap > 0:
            self._size = cap
            return None
        return "no max_client_batch_size"

    def forget_cap(self) -> None:
        """Drop the cap servers stated, so the configured (or ``/info``) size is used again."""
        with self._lock:
            self._cap = None

    def remember_cap(self, cap: int, refused: int, provider: str) -> None:
        """Keep the smallest cap a server stated, for every later call."""
        with self._lock:
            if self._cap is None or cap < self._cap:
                self._cap = cap
                log.warning(
                    "rerank.batch_size_learned", provider=provider, batch_size=cap,
                    refused=refused,
                )  # fmt: skip
