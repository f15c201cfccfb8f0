"""`ClientCore`: everything of a rerank client that is neither sync nor async.

As httpx's ``BaseClient``: the configuration, checked once where it enters; the httpx client
and who owns it; what the server taught (`plan.Learned`); starting a call (arguments checked
and snapshotted, the deadline armed) and turning its pairs into the caller's items.
`RerankClient` and `AsyncRerankClient` add only the I/O.
"""

from __future__ import annotations

import random as _random
import time
from collections.abc import Callable, Sequence
from operator import itemgetter
from typing import Generic, Literal, TypeVar

import httpx

from .. import _deadline, validate
from .._args import check_sendable, rank, snapshot
from .._deadline import Deadline
from .._redact import masked_url
from ..errors import RerankClientClosedError
from ..models import ClientResponse, RerankResponse
from .body import DEFAULT_MAX_RESPONSE_BYTES
from .flow import Call
from .plan import Learned, Plan
from .providers import check_required_fields, get_format
from .steps import Pairs

__all__ = ["CLOSED", "ClientCore"]

H = TypeVar("H", httpx.Client, httpx.AsyncClient)
T = TypeVar("T")

CLOSED = (
    "this {cls} has been closed: create a new client (or keep this one open) "
    "instead of reusing a closed one"
)


class ClientCore(Generic[H]):
    """Configuration, the httpx client and what the server taught, shared by both drivers."""

    _http: H | None

    def __init__(
        self,
        base_url: str,
        *,
        provider: str = "tei",
        model: str | None = None,
        api_key: str | None = None,
        api_key_header: str = "apikey",
        timeout: float = 30.0,
        max_retries: int = 2,
        batch_size: int | Literal["auto"] | None = None,
        http_client: H | None = None,
        max_concurrency: int = 8,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
        send_baggage: bool = True,
    ) -> None:
        # One rule per value, shared with RerankSettings and the CLI (validate.py); each
        # refusal is a ValueError whose ``field`` names the argument.
        base_url = validate.endpoint(base_url, "base_url")
        # Credentials leave the URL before httpx sees it (its INFO line prints the URL): the
        # requests go to `request_url`; `base_url` stays as given, shown only masked.
        request_url, basic_auth = validate.split_credentials(base_url)
        if http_client is not None and not isinstance(http_client, self._http_type()):
            raise TypeError(
                f"{type(self).__name__} needs an {self._http_type().__name__} as http_client, "
                f"got {type(http_client).__name__}"
            )
        timeout = validate.timeout(timeout)
        api_key_header = validate.header_name(api_key_header)
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise validate.InvalidSetting(
                "max_retries", f"must be an int >= 0, got {max_retries!r}"
            )
        batch_size = validate.batch_size(batch_size)
        if (
            isinstance(max_concurrency, bool)
            or not isinstance(max_concurrency, int)
            or max_concurrency < 1
        ):
            raise validate.InvalidSetting(
                "max_concurrency", f"must be an int >= 1, got {max_concurrency!r}"
            )
        # Never echo the key: it would land in whatever logs the caller's traceback.
        api_key = validate.api_key(api_key)
        if basic_auth is not None and api_key and api_key_header.lower() == "authorization":
            raise validate.InvalidSetting(
                "base_url",
                "carries user:password credentials, which would replace the api_key sent as "
                "Authorization: Bearer: give one or the other",
            )
        max_response_bytes = validate.max_response_bytes(max_response_bytes)
        wire = get_format(provider)
        check_required_fields(wire, model=model)
        self.base_url = base_url.rstrip("/")
        self.model = model
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.max_concurrency = max_concurrency
        self._plan = Plan(
            format=wire,
            base_url=request_url.rstrip("/"),
            model=model,
            api_key=api_key,
            api_key_header=api_key_header,
            timeout=self.timeout,
            max_retries=max_retries,
            # The retry jitter and the deadline clock: not settings, so not in the signature;
            # tests replace them (tests/hooks.py).
            random=_random.random,
            clock=time.monotonic,
            max_response_bytes=max_response_bytes,
            send_baggage=bool(send_baggage),
            basic_auth=basic_auth,
        )
        self._learned = Learned(
            wire.batch_size,
            configured=batch_size if isinstance(batch_size, int) else None,
            auto=batch_size == "auto",
            has_info=wire.name == "tei",
            ask_model=model is None and wire.name == "tei",
        )
        self._owns_http = http_client is None
        self._http = http_client if http_client is not None else self._new_http()

    def _new_http(self) -> H | None:
        """A fresh httpx client of the flavour the subclass drives (TLS verification on), or
        None when the subclass sends through I/O of its own (the async client's aiohttp)."""
        raise NotImplementedError

    def _is_closed(self) -> bool:
        """Whether the client's HTTP I/O has been closed."""
        return self._http is not None and self._http.is_closed

    @classmethod
    def _http_type(cls) -> type[H]:
        raise NotImplementedError

    # -- public read-only facts -------------------------------------------------------------

    @property
    def provider(self) -> str:
        """The wire format's name (``tei``, ``cohere``, ...)."""
        return self._plan.provider

    @property
    def batch_size(self) -> int:
        """Texts per request now. An explicit ``batch_size=N`` is a ceiling: never raised, only
        lowered by a cap the server states (TEI's ``/info``, or a refusal's "at most M"). With
        the default (None), the provider's documented cap (TEI: 32) until TEI's ``/info`` is
        read, then the ``max_client_batch_size`` it advertises (up or down), lowered by any
        refusal's cap. A TEI client reads ``/info`` once: on its first call larger than 32
        texts, or its first traced call without a configured model (for the model's name);
        with ``batch_size="auto"`` on its first call, whatever its size."""
        return self._learned.batch_size

    @property
    def max_response_bytes(self) -> int:
        """The most bytes one response may take, on the wire and decoded; a larger one is a
        `RerankProtocolError` naming this setting (docs/reliability.md)."""
        return self._plan.max_response_bytes

    def reset_batch_size(self) -> None:
        """Forget the batch caps servers stated (a refusal's "at most N"), so the configured
        size is tried again: a cap learned once is otherwise kept for the client's life."""
        self._learned.forget_cap()

    @property
    def configured_model(self) -> str | None:
        """The model given in configuration, never what a server reported: the label metrics
        use (a server's string per answer would be unbounded metric cardinality)."""
        return self.model

    @property
    def model_name(self) -> str | None:
        """The model to record: the configured one, else what the server reported."""
        return self.model or self._learned.model

    def __repr__(self) -> str:
        key = "<set>" if self._plan.api_key else None
        return (
            f"{type(self).__name__}(base_url={masked_url(self.base_url)!r}, "
            f"provider={self.provider!r}, "
            f"model={self.model!r}, api_key={key}, timeout={self.timeout})"
        )

    # -- a call's start and end, the same for both drivers ----------------------------------

    def _begin(
        self, query: str, items: Sequence[T], text: Callable[[T], str] | None, top_k: int | None
    ) -> tuple[list[T], Call]:
        """Refuse a closed client, check and snapshot the arguments, arm the deadline."""
        if self._is_closed():
            raise RerankClientClosedError(CLOSED.format(cls=type(self).__name__))
        kept, texts, cap = snapshot(query, items, text, top_k)
        check_sendable(query, texts)
        # Inside a `RerankerChain` the call gets at most what the chain's deadline has left.
        shared = _deadline.remaining()
        seconds = self.timeout if shared is None else min(self.timeout, shared)
        deadline = Deadline(seconds, self._plan.clock)
        # `time.time` is looked up per call, so a test's fake clock reaches Retry-After dates.
        return kept, Call(self._plan, self._learned, query, texts, cap, deadline, time.time)

    def _finish(self, items: list[T], call: Call, pairs: Pairs) -> RerankResponse[T]:
        """The call's response: each checked (index, score) pair turned back into the caller's
        own item, best first, with the indices kept beside them (`RerankResponse.indices`)."""
        ranked = rank(pairs, call.top_k)
        indices = list(map(itemgetter(0), ranked))
        return ClientResponse(
            results=list(
                zip(map(items.__getitem__, indices), map(itemgetter(1), ranked), strict=True)
            ),
            usage=call.usage,
            model=call.model or self.model_name,
            served_model=call.model,
            requests=call.requests,
            retries=call.retries,
            batches=call.batches,
            indices=indices,
        )

    def _closed_error(self) -> RerankClientClosedError:
        return RerankClientClosedError(CLOSED.format(cls=type(self).__name__))
