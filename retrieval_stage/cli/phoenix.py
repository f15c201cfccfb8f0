"""`eval --phoenix`: the eval's judgements, logged onto its spans in Arize Phoenix.

Phoenix computes NDCG@k, precision@k and hit for a span's documents only from document
annotations logged against that span. With ``--phoenix`` every judged query runs as a traced
pipeline (a RETRIEVER span with recall's candidates, the RERANKER span with the reranked ones);
each document those spans show gets its judged grade (the qrels; 0 when unjudged, as ir-measures
counts it) as a document annotation, through Phoenix's public client (``arize-phoenix-client``,
the ``[phoenix]`` extra): ``Client.spans.log_document_annotations``.

Phoenix's project page summarises document annotations by name (NDCG, precision, hit averaged
over every span with that name), so the RETRIEVER's grades are named ``recall.relevance`` and
the RERANKER's ``rerank.relevance`` (`BY_KIND`): one summary for recall, one for the rerank,
never averaged together. ``--phoenix-annotation relevance`` (`SHARED`) keeps the single name
``relevance`` of earlier versions, for saved Phoenix queries that name it.

Positions are the span's own: the documents a finished span holds are read back from its
attributes and checked, one by one, against the ranking the eval scored, so a grade can never
land on another document, even when an attribute limit left the tail off the span.

Phoenix 20.x computes retrieval metrics only from annotations whose annotator kind is ``LLM``
(its ``document_retrieval_metrics`` data loader filters on it), so the judgements, human or
not, are logged with that kind and say where they came from in their metadata.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from threading import Lock
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from openinference.semconv.trace import (
    DocumentAttributes,
    OpenInferenceSpanKindValues,
    RerankerAttributes,
    SpanAttributes,
)
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from ..models import Candidate

__all__ = [
    "ANNOTATION_NAME",
    "BY_KIND",
    "FROM_OTLP",
    "RERANKER_ANNOTATION",
    "RETRIEVER_ANNOTATION",
    "SHARED",
    "DocumentSpans",
    "FixedRecall",
    "PhoenixUnavailableError",
    "SpanDocuments",
    "judgements",
    "log_judgements",
    "phoenix_url",
]

ANNOTATION_NAME = "relevance"
"""The one annotation name of earlier versions, on both kinds of span (`SHARED`): Phoenix's
project page then averages recall's and the rerank's grades into one summary."""
RETRIEVER_ANNOTATION = "recall.relevance"
"""The annotation name of the judgements on RETRIEVER spans (recall's ranking)."""
RERANKER_ANNOTATION = "rerank.relevance"
"""The annotation name of the judgements on RERANKER spans (the reranked order)."""

INGEST_WAIT_S = 60.0
"""How long to wait for Phoenix to store the spans before annotating them: it inserts spans
in batches a moment after the OTLP request returned."""

BATCH = 500
"""Annotations per request."""

_RERANKER = OpenInferenceSpanKindValues.RERANKER.value
_RETRIEVER = OpenInferenceSpanKindValues.RETRIEVER.value

BY_KIND: Mapping[str, str] = MappingProxyType(
    {_RETRIEVER: RETRIEVER_ANNOTATION, _RERANKER: RERANKER_ANNOTATION}
)
"""The default: each span kind's judgements under a name of their own."""
SHARED: Mapping[str, str] = MappingProxyType(
    {_RETRIEVER: ANNOTATION_NAME, _RERANKER: ANNOTATION_NAME}
)
"""The compatibility choice: both under ``relevance``, as before (Phoenix averages them)."""
_DOCUMENT_LISTS = {
    _RERANKER: RerankerAttributes.RERANKER_OUTPUT_DOCUMENTS,
    _RETRIEVER: SpanAttributes.RETRIEVAL_DOCUMENTS,
}


class PhoenixUnavailableError(RuntimeError):
    """Phoenix cannot be reached or refused the judgements; the message says which."""


FROM_OTLP = "otlp"
"""What a bare ``--phoenix`` stands for (`help.with_bare_values` rewrites it to
``--phoenix=otlp``; spelled out, ``--phoenix otlp`` means the same): Phoenix is where the OTLP
traces go."""


def phoenix_url(given: str, traces_endpoint: str | None) -> str:
    """Phoenix's base URL: `given`, or for `FROM_OTLP` (a bare ``--phoenix``) the scheme and
    host of the OTLP traces endpoint (Phoenix takes OTLP/HTTP on the same port as its API and
    UI).

    ValueError (a usage error) when neither gives an http(s) URL.
    """
    from_otlp = given == FROM_OTLP
    source = traces_endpoint if from_otlp else given
    if from_otlp and not source:
        raise ValueError(
            "--phoenix without a URL takes Phoenix's address from OTEL_EXPORTER_OTLP_ENDPOINT, "
            "which is not set: give --phoenix http://HOST:6006"
        )
    parts = urlsplit(source or "")
    if parts.scheme not in ("http", "https") or not parts.hostname:
        where = " (from OTEL_EXPORTER_OTLP_ENDPOINT)" if from_otlp else ""
        raise ValueError(
            f"--phoenix needs an http(s) URL such as http://localhost:6006, got {source!r}{where}"
        )
    path = "" if from_otlp else parts.path.rstrip("/")  # the endpoint's path is OTLP's
    return f"{parts.scheme}://{parts.netloc.rpartition('@')[2]}{path}"


@dataclass(frozen=True, slots=True)
class SpanDocuments:
    """One finished RETRIEVER or RERANKER span: its id (16 hex digits), kind, and the ids of
    the documents it holds, in its order (position 0 first)."""

    span_id: str
    kind: str
    document_ids: tuple[str, ...]


class DocumentSpans(SpanProcessor):
    """Remembers every RETRIEVER and RERANKER span that ends, until `drain`ed.

    The eval reranks one query at a time, so the spans drained after a query's pipeline run
    are that query's.
    """

    def __init__(self) -> None:
        self._lock = Lock()
        self._ended: list[SpanDocuments] = []

    def on_end(self, span: ReadableSpan) -> None:
        attributes = span.attributes or {}
        kind = attributes.get(SpanAttributes.OPENINFERENCE_SPAN_KIND)
        if kind not in _DOCUMENT_LISTS or span.context is None:
            return
        found = SpanDocuments(
            span_id=format(span.context.span_id, "016x"),
            kind=str(kind),
            document_ids=document_ids(attributes, _DOCUMENT_LISTS[str(kind)]),
        )
        with self._lock:
            self._ended.append(found)

    def drain(self) -> list[SpanDocuments]:
        """The spans ended since the last call, oldest first."""
        with self._lock:
            ended, self._ended = self._ended, []
        return ended

    def shutdown(self) -> None:
        """Nothing to release."""

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        """Nothing buffered for export."""
        return True


def document_ids(attributes: Mapping[str, Any], prefix: str) -> tuple[str, ...]:
    """The ``<prefix>.<i>.document.id`` values for i = 0, 1, ... while they are there."""
    ids: list[str] = []
    while True:
        value = attributes.get(f"{prefix}.{len(ids)}.{DocumentAttributes.DOCUMENT_ID}")
        if not isinstance(value, str):
            return tuple(ids)
        ids.append(value)


class FixedRecall:
    """A `Recall` that hands over candidates already found (read from --candidates, or by
    --recall before the eval), so the eval's RETRIEVER span shows exactly what was reranked."""

    def __init__(self, candidates: Sequence[Candidate], name: str) -> None:
        self.candidates = list(candidates)
        self.name = name

    def recall(self, query: str, k: int) -> list[Candidate]:
        """The fixed candidates, at most `k`."""
        return self.candidates[:k]


def judgements(
    spans: Sequence[SpanDocuments],
    *,
    query_id: str,
    recalled: Sequence[str],
    reranked: Sequence[str],
    judged: Mapping[str, int],
    names: Mapping[str, str] = BY_KIND,
) -> list[dict[str, Any]]:
    """One annotation per document on each span, graded from `judged`, named by the span's
    kind from `names` (`BY_KIND`: ``recall.relevance`` and ``rerank.relevance``).

    `recalled` and `reranked` are the rankings (document ids, best first) the eval scored for
    `query_id`; each span's documents must be a prefix of its kind's ranking (ids as the span
    shows them: cut ones end in the truncation marker), or ValueError: a grade must never
    land on another document. Unjudged documents grade 0, as ir-measures counts them.
    """
    from ..spans import TRUNCATION_MARKER

    expected = {_RETRIEVER: recalled, _RERANKER: reranked}
    out: list[dict[str, Any]] = []
    for span in spans:
        ranking = expected[span.kind]
        if len(span.document_ids) > len(ranking):
            raise ValueError(
                f"{span.kind} span {span.span_id} shows {len(span.document_ids)} documents; "
                f"the eval ranked {len(ranking)} for query {query_id!r}"
            )
        for position, shown in enumerate(span.document_ids):
            doc_id = ranking[position]
            cut = shown.endswith(TRUNCATION_MARKER) and doc_id.startswith(
                shown[: -len(TRUNCATION_MARKER)]
            )
            if shown != doc_id and not cut:
                raise ValueError(
                    f"{span.kind} span {span.span_id} shows {shown!r} at position {position}; "
                    f"the eval ranked {doc_id!r} there for query {query_id!r}"
                )
            grade = judged.get(doc_id, 0)
            out.append(
                {
                    "name": names[span.kind],
                    "span_id": span.span_id,
                    "document_position": position,
                    "annotator_kind": "LLM",  # the only kind Phoenix computes metrics from
                    "result": {
                        "score": float(grade),
                        "label": "relevant" if grade > 0 else "not relevant",
                    },
                    "metadata": {
                        "source": "qrels",
                        "query_id": query_id,
                        "document_id": doc_id,
                        "judged": doc_id in judged,
                    },
                }
            )
    return out


def log_judgements(
    url: str,
    annotations: Sequence[dict[str, Any]],
    *,
    wait_s: float = INGEST_WAIT_S,
    client: Any = None,
) -> int:
    """Log `annotations` to the Phoenix at `url`; how many Phoenix stored.

    Sent with ``sync=True`` so Phoenix checks each span exists and each position is in range;
    a batch naming a span Phoenix has not stored yet (404) is retried for up to `wait_s`.
    `PhoenixUnavailableError` when Phoenix cannot be reached, or refuses a batch for another
    reason (its message quoted), or the spans never arrive.
    """
    import httpx

    if client is None:
        from phoenix.client import Client

        client = Client(base_url=url)
    stored = 0
    deadline = time.monotonic() + wait_s
    for start in range(0, len(annotations), BATCH):
        batch = list(annotations[start : start + BATCH])
        while True:
            try:
                inserted = client.spans.log_document_annotations(
                    document_annotations=batch, sync=True
                )
            except httpx.HTTPStatusError as exc:
                status = exc.response.status_code
                if status == 404 and time.monotonic() < deadline:
                    time.sleep(0.5)  # the spans are still on their way into Phoenix
                    continue
                detail = exc.response.text.strip()[:300]
                raise PhoenixUnavailableError(
                    f"Phoenix at {url} refused the judgements: HTTP {status} {detail}"
                ) from None
            except httpx.HTTPError as exc:
                raise PhoenixUnavailableError(
                    f"Phoenix at {url} cannot be reached: {type(exc).__name__}"
                ) from None
            stored += len(inserted or ())
            break
    return stored
