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

__all__ = [
    "EXPIRED",
    "Finished",
    "Flow",
    "Fork",
    "Outcome",
    "Pairs",
    "Reply",
    "Send",
    "Sleep",
    "Step",
    "advance",
]

Pairs: TypeAlias = list[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Reply:
    """A response read in full."""

    status_code: int
    headers: Mapping[str, str]
    content: bytes

    @property
    def is_success(self) -> bool:
        return 200 <= self.status_code < 300


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
