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

__all__ = ["InfoQuestion", "Learned", "Plan"]

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


@dataclass(frozen=True, slots=True)
class InfoQuestion:
    """Why one call asks TEI's ``GET /info`` (at most one call of a client ever does)."""

    cap: bool
    """The answer's ``max_client_batch_size`` is what this call needs: a failure is logged as
    ``rerank.info_unavailable``."""
    model: bool
    """The answer's ``model_id`` is wanted for the span: its absence is ``rerank.model_unknown``."""
    loud: bool = False
    """``batch_size="auto"`` asked for the cap: a failure is a warning, not an info line."""


class Learned:
    """What the server taught one client, shared by all its calls.

    The batch size a call plans with: the explicit `configured` size, else `default` (the
    provider's documented cap); once ``/info`` has been read, its ``max_client_batch_size``
    replaces `default`, and lowers (never raises) a configured size; a refusal's stated cap
    lowers either for every later call, until `forget_cap`.
    """

    def __init__(
        self,
        default: int,
        *,
        configured: int | None = None,
        auto: bool = False,
        has_info: bool = False,
        ask_model: bool = False,
    ) -> None:
        self._default = default
        self._configured = configured
        self._info_cap: int | None = None
        self._cap: int | None = None
        self.model: str | None = None
        self._auto = auto
        self._has_info = has_info
        # TEI names its model only in ``/info``: with no model configured, a traced call asks
        # it (once per client, whatever the answer), so spans and metrics carry a model name.
        self._ask_model = ask_model
        self._asked = not (auto or has_info)
        self._lock = threading.Lock()

    @property
    def batch_size(self) -> int:
        """Texts per request now: the configured size (else ``/info``'s cap, else the
        provider's), lowered by ``/info``'s cap and by a cap a refusal stated."""
        size = self._configured if self._configured is not None else self._default
        info = self._info_cap
        if info is not None:
            size = info if self._configured is None else min(size, info)
        return size if self._cap is None else min(size, self._cap)

    def take_info_question(self, n_texts: int, *, recording: bool) -> InfoQuestion | None:
        """Whether this call asks ``/info``, and what for; at most one call per client asks,
        also when calls start concurrently, whatever the answer.

        Asked by the first call with `batch_size="auto"`; otherwise (TEI only) by the first
        call with more texts than the batch size in force (``/info`` may allow the whole call
        in one request, or tell a smaller cap before a refusal would), or by the first traced
        call with no model configured (the model's name for the span). An explicit
        ``batch_size`` never asks for the cap: the user chose it.
        """
        if self._asked:  # the common case: decided without the lock
            return None
        cap = self._auto or (
            self._has_info and self._configured is None and n_texts > self.batch_size
        )
        model = self._ask_model and recording
        if not (cap or model):
            return None
        with self._lock:
            if self._asked:  # a concurrent call asks it
                return None
            self._asked = True
        return InfoQuestion(cap=cap, model=model, loud=self._auto)

    def apply_info(
        self, info: Any, clean: Callable[[str], str | None]
    ) -> tuple[str | None, str | None]:
        """Take the model and the batch cap from TEI's ``/info``; why each is missing (the
        cap's, then the model's), or None where it was found.

        The model id is server text: `clean` (the flow's sanitiser, which also caps it) is
        applied before it is kept, since it reaches spans and responses."""
        if not isinstance(info, dict):
            return "not a JSON object", "not a JSON object"
        model_id = info.get("model_id")
        model = clean(model_id) if isinstance(model_id, str) and model_id else None
        cap = info.get("max_client_batch_size")
        good = isinstance(cap, int) and not isinstance(cap, bool) and cap > 0
        with self._lock:
            if model:
                self.model = model
            if good:
                self._info_cap = cap
        return (None if good else "no max_client_batch_size", None if model else "no model_id")

    def forget_cap(self) -> None:
        """Drop the caps refusals stated, so the configured (or ``/info``) size is used
        again."""
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
