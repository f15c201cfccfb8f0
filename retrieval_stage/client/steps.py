"""The steps of a sans-I/O rerank flow and the answers a driver gives them.

As httpx's ``Auth.auth_flow``, a flow is a generator that decides and never does I/O: it yields
`Send` (make this request, send me back a `Reply`, an `httpx.HTTPError` or `EXPIRED`), `Sleep`
(wait this long before a retry) and `Fork` (run these sub-flows, send me back their results in
order), and returns the call's (index, score) pairs or raises a `RerankError`. `advance` is the
one way a driver moves a flow on.
"""

from __future__ import annotations

from collections.abc import Generator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeAlias

import httpx

from .codec import dumps, loads

__all__ = [
    "EXPIRED",
    "UNDECODED",
    "Finished",
    "Flow",
    "Fork",
    "NotJson",
    "Outcome",
    "Pairs",
    "Reply",
    "Send",
    "Sleep",
    "Step",
    "advance",
]

Pairs: TypeAlias = list[tuple[int, float]]


class _Undecoded:
    def __repr__(self) -> str:
        return "UNDECODED"


UNDECODED: Any = _Undecoded()


@dataclass(frozen=True, slots=True)
class Reply:
    """A response read in full (within `max_response_bytes`, decoded).

    `decoded` is its JSON value when the driver already decoded it (the async client decodes a
    large body in slices, giving the loop back between them: `json_steps.async_reply`), the
    `NotJson` that decoding raised, or `UNDECODED`."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes
    decoded: Any = UNDECODED

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300

    def json(self) -> Any:
        """The body's JSON value; ValueError or RecursionError when it is not JSON."""
        if isinstance(self.decoded, NotJson):
            raise self.decoded.error
        if self.decoded is not UNDECODED:
            return self.decoded
        return loads(self.content)


@dataclass(frozen=True, slots=True)
class NotJson:
    """What decoding a body raised, kept so it is never decoded twice."""

    error: ValueError | RecursionError


class Expired:
    """The driver's answer to a `Send` when the call's deadline ran out during it."""

    def __repr__(self) -> str:
        return "EXPIRED"


EXPIRED = Expired()

Outcome: TypeAlias = "Reply | httpx.HTTPError | Expired"


@dataclass(frozen=True, slots=True)
class Send:
    """Make this request; answer with an `Outcome`."""

    method: Literal["GET", "POST"]
    url: str
    headers: dict[str, str]
    body: dict[str, Any] | None = None

    def encoded(self) -> tuple[dict[str, str], bytes | None]:
        """The headers and the body's bytes to send: the body as httpx's ``json=`` writes it
        (`codec.dumps`), with its content type; the headers as they are without a body."""
        if self.body is None:
            return self.headers, None
        return {**self.headers, "content-type": "application/json"}, dumps(self.body)


@dataclass(frozen=True, slots=True)
class Sleep:
    """Wait `seconds` before the next attempt; answer with None."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Fork:
    """Run every flow to its end (concurrently where the driver can); answer with their
    results in order. If one raises, the others are abandoned and the call fails whole."""

    flows: list[Flow]


Step: TypeAlias = "Send | Sleep | Fork"
Flow: TypeAlias = "Generator[Step, Any, Pairs]"


@dataclass(frozen=True, slots=True)
class Finished:
    """The flow ended with `value`."""

    value: Pairs


def advance(flow: Flow, answer: Any) -> Step | Finished:
    """Give `flow` the answer to its last step; its next step, or `Finished`. What the flow
    raises (a `RerankError`) goes to the driver's caller."""
    try:
        return flow.send(answer)
    except StopIteration as done:
        return Finished(done.value)
