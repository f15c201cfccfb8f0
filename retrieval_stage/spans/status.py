"""Status OK on the spans we end after they did their work.

OpenInference's own instrumentations (haystack, openai, llama-index and others) end a span that
succeeded with status OK, and Phoenix shows a span left UNSET as "Unset", which a reader takes
for something unfinished. So every RERANKER, RETRIEVER and CHAIN span this library ends is OK
when it succeeded; a failure keeps the ERROR status set where it happened (OpenTelemetry makes
OK final, so it is set only on a span whose status is still UNSET).
"""

from __future__ import annotations

from opentelemetry.trace import Span, Status, StatusCode

__all__ = ["OK", "mark_ok"]

OK = Status(StatusCode.OK)


def mark_ok(span: Span) -> None:
    """Set `span`'s status to OK unless it is not recording or a status was already set (an
    ERROR stays ERROR); a span whose status cannot be read is left as it is."""
    if not span.is_recording():
        return
    status = getattr(span, "status", None)
    if isinstance(status, Status) and status.status_code is StatusCode.UNSET:
        span.set_status(OK)
