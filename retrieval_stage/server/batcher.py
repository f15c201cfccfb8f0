"""Dynamic batching: concurrent requests packed into model batches, each answered its own scores.

Requests wait in one bounded queue (`max_queue` requests; one more is refused with TEI's 429).
One task takes work from the front, in arrival order, while the batch stays within
`max_batch_pairs` (query, text) pairs and `max_batch_tokens` tokens, waits `batch_wait` seconds
for company when the model was idle, and runs the batch on the one model thread, so the event
loop keeps serving. A request larger than one batch's budget is cut into slices when its model
scores pairs independently (the cross-encoder, the embedding model); the lexical reranker's
requests are never cut (one slice may then exceed the budget). A request's scores are put back
together from its slices by position, so nothing depends on where in a batch a text ran.

A request costs at most `max_request_tokens` tokens (its texts' as the model reads them, and its
query's where the model reads it apart): one more is refused before it is queued, so no request
can hold the model thread for longer than that much work takes. A request whose client went
away is `abandon`-ed: its slices still queued are skipped, and `wait` does that by itself when
the caller's ``gone`` finishes first. `refuse_all` answers every request not yet answered with
TEI's 503 (the end of a drain); `stop` does the same once the batching task has stopped.

Each batch is reported to `on_batch` once it ran (the server turns that into one span per
request in it, and metrics); it gets every request of the batch with its share and wait.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from .scorers import Group, Scorer
from .wire import ApiError, overloaded, too_much_work

__all__ = ["Batch", "BatchShare", "Batcher", "ClientGone", "Ticket", "plan_slices", "request_cost"]


class ClientGone(Exception):
    """The client went away before its scores were ready (`Batcher.wait`); nothing to answer."""


def request_cost(kind: str, tokens: Sequence[int], query_tokens: int) -> int:
    """Tokens one request costs the model: its texts', plus the query's where the model reads
    the query apart (the embedding model, the lexical reranker); a cross-encoder's pair counts
    already hold the query."""
    return sum(tokens) + (0 if kind == "local" else query_tokens)


def plan_slices(
    tokens: Sequence[int], query_tokens: int, *, max_pairs: int, max_tokens: int
) -> list[tuple[int, int]]:
    """Cut a request's texts into [start, end) slices that each fit one batch's budget.

    A slice costs its texts' tokens plus, for a bi-encoder, the query's once (`query_tokens`;
    0 for a cross-encoder, whose pair counts already hold it). Every slice has at least one
    text, so a text alone over the budget still runs (alone).
    """
    slices: list[tuple[int, int]] = []
    start, used = 0, query_tokens
    for i, n in enumerate(tokens):
        if i > start and (i - start >= max_pairs or used + n > max_tokens):
            slices.append((start, i))
            start, used = i, query_tokens
        used += n
    if tokens:
        slices.append((start, len(tokens)))
    return slices


@dataclass(eq=False)
class Ticket:
    """One request in the batcher: its group, token counts, where its scores go."""

    group: Group
    tokens: list[int]
    query_tokens: int
    context: Any
    """What `on_batch` gets to say whose batch it was (the request's OpenTelemetry context)."""
    enqueued: float = field(default_factory=time.monotonic)
    scores: list[float] = field(default_factory=list)
    pending: int = 0
    future: asyncio.Future[list[float]] = field(init=False)
    first_start: float | None = None
    batches: int = 0

    def __post_init__(self) -> None:
        self.future = asyncio.get_running_loop().create_future()
        self.scores = [0.0] * len(self.group.texts)

    @property
    def queue_wait(self) -> float:
        """Seconds from arrival to the start of its first batch."""
        return (self.first_start or time.monotonic()) - self.enqueued


@dataclass(frozen=True, slots=True)
class _Slice:
    ticket: Ticket
    start: int
    end: int
    tokens: int


@dataclass(frozen=True, slots=True)
class BatchShare:
    """One request's part of a batch: how many pairs and tokens, and how long it had waited."""

    ticket: Ticket
    pairs: int
    tokens: int
    queue_wait: float


@dataclass(frozen=True, slots=True)
class Batch:
    """One model batch that ran: when, how big, whose, and how it ended."""

    number: int
    started: float
    ended: float
    started_ns: int
    ended_ns: int
    shares: list[BatchShare]
    error: BaseException | None = None

    @property
    def pairs(self) -> int:
        return sum(s.pairs for s in self.shares)

    @property
    def tokens(self) -> int:
        return sum(s.tokens for s in self.shares)


class Batcher:
    """The queue and the task that packs it into model batches (see the module docstring)."""

    def __init__(
        self,
        scorer: Scorer,
        executor: Executor,
        *,
        max_batch_pairs: int,
        max_batch_tokens: int,
        max_queue: int,
        batch_wait: float,
        max_request_tokens: int,
        on_batch: Callable[[Batch], None] | None = None,
    ) -> None:
        self.scorer = scorer
        self.executor = executor
        self.max_batch_pairs = max_batch_pairs
        self.max_batch_tokens = max_batch_tokens
        self.max_queue = max_queue
        self.batch_wait = batch_wait
        self.max_request_tokens = max_request_tokens
        self.on_batch = on_batch
        self._slices: collections.deque[_Slice] = collections.deque()
        self._waiting: set[Ticket] = set()
        self._running: list[Ticket] = []
        self._admitting = 0
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._batches = 0

    @property
    def depth(self) -> int:
        """Requests waiting for their first batch."""
        return len(self._waiting)

    def start(self) -> None:
        """Start the batching task on the running loop."""
        self._task = asyncio.get_running_loop().create_task(self._run(), name="rerank-batcher")

    async def stop(self) -> None:
        """Stop taking work; every request not yet answered, queued or on the model thread, is
        refused as unhealthy (TEI's 503)."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.refuse_all()

    def refuse_all(self, message: str = "the server is stopping") -> int:
        """Answer every request not yet answered with TEI's 503 and drop their queued work;
        how many were refused. The batch on the model thread finishes, unread."""
        refused = 0
        for ticket in [p.ticket for p in self._slices] + self._running:
            if not ticket.future.done():
                ticket.future.set_exception(ApiError("Unhealthy", message))
                refused += 1
        self._slices.clear()
        self._waiting.clear()
        return refused

    def abandon(self, ticket: Ticket) -> None:
        """The ticket's client went away: its slices still queued are skipped, never scored."""
        if not ticket.future.done():
            ticket.future.cancel()
        self._waiting.discard(ticket)

    async def wait(self, ticket: Ticket, gone: Awaitable[object]) -> list[float]:
        """The ticket's scores, in input order; `ClientGone` once `gone` finishes first (the
        client hung up), and the ticket is abandoned then, or if this wait is cancelled."""
        watcher: asyncio.Future[Any] = asyncio.ensure_future(gone)
        either: set[asyncio.Future[Any]] = {ticket.future, watcher}
        try:
            await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
            if not ticket.future.done():
                raise ClientGone
            return ticket.future.result()
        finally:
            watcher.cancel()
            if not ticket.future.done():
                self.abandon(ticket)

    @contextlib.contextmanager
    def admission(self) -> Iterator[None]:
        """Hold a place in the queue while the request is prepared (its tokens counted):
        TEI's 429 at once when the queue and the requests already being prepared fill it, so
        a refusal never waits behind the token-count thread."""
        if len(self._waiting) + self._admitting >= self.max_queue:
            raise overloaded()
        self._admitting += 1
        try:
            yield
        finally:
            self._admitting -= 1

    def submit(self, group: Group, tokens: list[int], query_tokens: int, context: Any) -> Ticket:
        """Queue one request (TEI's 429 `ApiError` when the queue is full); await
        ``ticket.future`` for its scores, in input order."""
        if len(self._waiting) >= self.max_queue:
            raise overloaded()
        cost = request_cost(self.scorer.kind, tokens, query_tokens)
        if cost > self.max_request_tokens:
            raise too_much_work(cost, self.max_request_tokens)
        ticket = Ticket(group, tokens, query_tokens, context)
        if self.scorer.splittable:
            # A bi-encoder embeds the query once per slice: that counts against the budget.
            per_slice = query_tokens if self.scorer.kind == "embedding" else 0
            plan = plan_slices(
                tokens,
                per_slice,
                max_pairs=self.max_batch_pairs,
                max_tokens=self.max_batch_tokens,
            )
        else:
            plan = [(0, len(tokens))]
            per_slice = 0
        ticket.pending = len(plan)
        for start, end in plan:
            self._slices.append(_Slice(ticket, start, end, per_slice + sum(tokens[start:end])))
        self._waiting.add(ticket)
        self._wake.set()
        return ticket

    def _take(self) -> list[_Slice]:
        """Slices from the front, in order, while the batch stays within its budget."""
        taken: list[_Slice] = []
        pairs = tokens = 0
        while self._slices:
            piece = self._slices[0]
            if piece.ticket.future.done():  # the caller went away: skip its work
                self._slices.popleft()
                self._waiting.discard(piece.ticket)
                continue
            n = piece.end - piece.start
            if taken and (
                pairs + n > self.max_batch_pairs or tokens + piece.tokens > self.max_batch_tokens
            ):
                break
            taken.append(self._slices.popleft())
            pairs += n
            tokens += piece.tokens
        return taken

    def _full(self) -> bool:
        live = [p for p in self._slices if not p.ticket.future.done()]
        pairs = sum(p.end - p.start for p in live)
        tokens = sum(p.tokens for p in live)
        return pairs >= self.max_batch_pairs or tokens >= self.max_batch_tokens

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            while not self._slices:
                self._wake.clear()
                await self._wake.wait()
            # An idle model waits a moment for company; a busy one found its queue filled.
            age = time.monotonic() - self._slices[0].ticket.enqueued
            if self.batch_wait > 0 and age < self.batch_wait and not self._full():
                await asyncio.sleep(self.batch_wait - age)
            taken = self._take()
            if not taken:
                continue
            await self._score(loop, taken)

    async def _score(self, loop: asyncio.AbstractEventLoop, taken: list[_Slice]) -> None:
        started, started_ns = time.monotonic(), time.time_ns()
        for piece in taken:
            ticket = piece.ticket
            if ticket.first_start is None:
                ticket.first_start = started
                self._waiting.discard(ticket)
        groups = [
            Group(
                p.ticket.group.query,
                p.ticket.group.texts[p.start : p.end],
                p.ticket.group.raw_scores,
            )
            for p in taken
        ]
        error: BaseException | None = None
        results: list[list[float]] = []
        self._running = [p.ticket for p in taken]
        try:
            results = await loop.run_in_executor(self.executor, self.scorer.score, groups)
            if len(results) != len(groups) or any(
                len(r) != len(g.texts) for r, g in zip(results, groups, strict=False)
            ):
                raise RuntimeError("the model returned scores for the wrong number of texts")
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # torch, tokenizer and our own errors: the batch failed
            error = exc
        self._running = []  # kept when cancelled: `stop` refuses what was on the model thread
        ended, ended_ns = time.monotonic(), time.time_ns()
        self._batches += 1
        shares: dict[Ticket, BatchShare] = {}
        for i, piece in enumerate(taken):
            ticket = piece.ticket
            ticket.batches += 1
            previous = shares.get(ticket)
            shares[ticket] = BatchShare(
                ticket,
                (previous.pairs if previous else 0) + piece.end - piece.start,
                (previous.tokens if previous else 0) + piece.tokens,
                started - ticket.enqueued,
            )
            if ticket.future.done():
                continue
            if error is not None:
                ticket.future.set_exception(
                    ApiError("Backend", f"Inference failed: {type(error).__name__}")
                )
                continue
            ticket.scores[piece.start : piece.end] = results[i]
            ticket.pending -= 1
            if ticket.pending == 0:
                ticket.future.set_result(ticket.scores)
        if self.on_batch is not None:
            self.on_batch(
                Batch(
                    self._batches,
                    started,
                    ended,
                    started_ns,
                    ended_ns,
                    list(shares.values()),
                    error,
                )
            )
