"""span_size: context: how many bytes a traced rerank puts on the wire, and what a fleet stores.

Two measured workloads, each a real traced `RerankStage` on `configure_tracing`'s provider (the
span limits and resource an application gets) with an in-memory exporter, its finished spans
encoded by our OTLP/protobuf encoder (`encode_spans_fast`, byte-identical to the SDK's, checked
here) as the ExportTraceServiceRequest the OTLP exporter would POST:

- ``synthetic``: the benchmark's 50 ~300-character passages (`fixtures.candidates`), reranked
  over HTTP by `RerankClient` against the loopback server's TEI route; also with 10 documents,
  so the bytes one more document costs come from the difference;
- ``corpus``: the 24 judged questions of the bundled example with BM25's top 50 (real
  docstring text, 40-1,200 characters), reranked by the lexical reranker.

Sizes are given raw and gzip-compressed (``gzip.compress``, level 6, as the OTLP exporters'
gzip): for one span alone in a request, and per span in a batch (the span processor sends up
to 512; repeated keys compress across spans). docs/scaling.md's numbers come from this
section's output (`fleet_volumes` turns bytes per span into bytes per day).
"""

from __future__ import annotations

import gzip
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..fixtures import DOCS, QUERY, LocalServer, candidates
from ..report import Row

if TYPE_CHECKING:  # tests import this module for its arithmetic without the harness
    from ..harness import Scale

SCALE = {"span_size_calls": (24, 24)}

RATES = (10, 100, 1_000)
"""Reranks per second across the fleet, for bytes per day."""
BASELINE = 0.05
"""The sampling tier's default probabilistic baseline (telemetry/otel-sampler.yaml)."""
DEGRADED = (0.001, 0.01, 0.05)
"""Shares of traces kept whatever the baseline (errors, fallbacks, retries, later tiers, slow)."""
SECONDS_PER_DAY = 86_400
GZIP_LEVEL = 6


CONTENT_SUFFIX = ".document.content"


def without_content(spans: Sequence[Any]) -> list[Any]:
    """`spans` as the gateway's drop-content overlay leaves them: no ``*.document.content``."""
    from opentelemetry.sdk.trace import ReadableSpan

    return [
        ReadableSpan(
            name=s.name,
            context=s.context,
            parent=s.parent,
            resource=s.resource,
            attributes={
                k: v for k, v in (s.attributes or {}).items() if not k.endswith(CONTENT_SUFFIX)
            },
            events=s.events,
            links=s.links,
            kind=s.kind,
            status=s.status,
            start_time=s.start_time,
            end_time=s.end_time,
            instrumentation_scope=s.instrumentation_scope,
        )
        for s in spans
    ]


def _composition(spans: Sequence[Any]) -> dict[str, float]:
    """Per span, UTF-8 bytes of attribute keys, of document content values, of other string
    values: what the protobuf bytes are made of (the rest is tags, lengths and numbers)."""
    keys = content = other = 0
    for s in spans:
        for k, v in (s.attributes or {}).items():
            keys += len(k.encode())
            if isinstance(v, str):
                if k.endswith(CONTENT_SUFFIX):
                    content += len(v.encode())
                else:
                    other += len(v.encode())
    n = len(spans)
    return {"key_bytes": keys / n, "content_bytes": content / n, "other_string_bytes": other / n}


def _sizes(spans: Sequence[Any], *, check_sdk: bool = True) -> dict[str, float]:
    """Bytes per span of `spans`: alone in a request, and batched, raw and gzip'd. With
    `check_sdk`, first that our encoder's bytes are the SDK's."""
    from retrieval_stage.telemetry.otlp_encoder import encode_spans_fast, sdk_serialize_spans

    alone = [encode_spans_fast([s]) for s in spans]
    batch = encode_spans_fast(spans)
    if check_sdk and batch != sdk_serialize_spans(spans):
        raise RuntimeError("encode_spans_fast and the SDK's encoder disagree")
    n = len(spans)
    stripped = encode_spans_fast(without_content(spans))
    return {
        **_composition(spans),
        "without_content_batched_raw": len(stripped) / n,
        "without_content_batched_gzip": len(gzip.compress(stripped, GZIP_LEVEL)) / n,
        "spans": n,
        "attributes_per_span": sum(len(s.attributes or {}) for s in spans) / n,
        "alone_raw": sum(len(b) for b in alone) / n,
        "alone_gzip": sum(len(gzip.compress(b, GZIP_LEVEL)) for b in alone) / n,
        "batched_raw": len(batch) / n,
        "batched_gzip": len(gzip.compress(batch, GZIP_LEVEL)) / n,
    }


def _rerank_spans(finished: Sequence[Any]) -> list[Any]:
    spans = [s for s in finished if s.name == "rerank"]
    if not spans:
        raise RuntimeError("no RERANKER span was exported")
    return spans


def measure_synthetic(server: LocalServer, calls: int) -> dict[str, Any]:
    """50-document (and 10-document) TEI-shaped reranks over loopback HTTP, traced."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankClient, RerankStage
    from retrieval_stage.telemetry import configure_tracing

    out: dict[str, Any] = {}
    for docs in (DOCS, 10):
        exporter = InMemorySpanExporter()
        provider = configure_tracing("retrieval-stage-bench", exporter=exporter)
        client = RerankClient(server.url, batch_size=DOCS)
        stage = RerankStage(client, tracer_provider=provider)
        for call in range(calls):
            # A different slice of passages each call, so a batch is not one span repeated.
            cands = candidates(DOCS + calls)[call : call + docs]
            stage.run(QUERY, cands)
        provider.force_flush()
        out[f"docs_{docs}"] = _sizes(_rerank_spans(exporter.get_finished_spans()))
        client.close()
        provider.shutdown()
    big, small = out[f"docs_{DOCS}"], out["docs_10"]
    out["per_document_raw"] = (big["batched_raw"] - small["batched_raw"]) / (DOCS - 10)
    out["per_document_gzip"] = (big["batched_gzip"] - small["batched_gzip"]) / (DOCS - 10)
    return out


def measure_corpus(
    docs: int = DOCS, *, reranker: Any = None, check_sdk: bool = True
) -> dict[str, Any]:
    """The bundled example's BM25 top `docs` per question, reranked by the lexical reranker
    (or `reranker`: the span's size does not depend on which scores it carries, and a test
    may pass a cheaper one with the lexical reranker's names)."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from retrieval_stage import RerankStage
    from retrieval_stage.evaluation import read_candidates, read_queries
    from retrieval_stage.evaluation.corpus import (
        EXAMPLE_CANDIDATES,
        EXAMPLE_QUERIES,
        data_path,
        load_corpus,
    )
    from retrieval_stage.local import LexicalReranker
    from retrieval_stage.models import recall_order
    from retrieval_stage.telemetry import configure_tracing

    corpus = {d.id: d for d in load_corpus()}
    queries = read_queries(data_path(EXAMPLE_QUERIES))
    pools = read_candidates(data_path(EXAMPLE_CANDIDATES), corpus)
    exporter = InMemorySpanExporter()
    provider = configure_tracing("retrieval-stage-bench", exporter=exporter)
    stage = RerankStage(reranker or LexicalReranker(), tracer_provider=provider)
    texts = 0
    documents = 0
    for qid, query in queries.items():
        pool = pools.get(qid)
        if not pool:
            continue
        ordered = [pool[i] for i in recall_order(pool)][:docs]
        texts += sum(len(c.text) for c in ordered)
        documents += len(ordered)
        stage.run(query, ordered)
    provider.force_flush()
    sizes = _sizes(_rerank_spans(exporter.get_finished_spans()), check_sdk=check_sdk)
    provider.shutdown()
    sizes["documents_per_span"] = documents / sizes["spans"]
    sizes["text_chars_per_document"] = texts / documents
    return sizes


def fleet_volumes(bytes_per_span: float, *, rates: Sequence[int] = RATES) -> dict[int, float]:
    """Bytes per day at each rate (reranks per second), one RERANKER span per rerank."""
    return {rate: bytes_per_span * rate * SECONDS_PER_DAY for rate in rates}


def kept_share(degraded: float, baseline: float = BASELINE) -> float:
    """The share of traces the sampling tier keeps: every degraded one, plus the baseline's
    share of the rest (the probabilistic policy hashes trace ids; the others always keep)."""
    return degraded + (1.0 - degraded) * baseline


def human_bytes(n: float) -> str:
    """Bytes as docs/scaling.md writes them: one decimal, binary units."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:,.1f} {unit}"
    return f"{n:.0f} B"


def measure(server: LocalServer, scale: Scale) -> dict[str, Any]:
    """Bytes per RERANKER span, synthetic over HTTP and on the bundled corpus."""
    corpus = {"docs_50": measure_corpus(DOCS), "docs_10": measure_corpus(10)}
    big, small = corpus["docs_50"], corpus["docs_10"]
    per_doc = big["documents_per_span"] - small["documents_per_span"]
    corpus["per_document_raw"] = (big["batched_raw"] - small["batched_raw"]) / per_doc
    corpus["per_document_gzip"] = (big["batched_gzip"] - small["batched_gzip"]) / per_doc
    return {"synthetic": measure_synthetic(server, scale.span_size_calls), "corpus": corpus}


def _kib(n: float) -> str:
    return f"{n / 1024:.1f} KiB"


def rows(result: dict[str, Any], results: dict[str, Any]) -> list[Row]:
    """Bytes per span raw / gzip, alone and batched, and a day at 1,000 reranks/s."""
    out: list[Row] = []
    labels = {
        f"docs_{DOCS}": f"span_size: synthetic {DOCS}-document span (TEI over HTTP)",
        "docs_10": "span_size: synthetic 10-document span",
    }
    for key, label in labels.items():
        s = result["synthetic"][key]
        out.append(
            (
                f"{label}, {s['attributes_per_span']:.0f} attributes: alone raw / gzip; "
                "batched raw / gzip",
                f"{_kib(s['alone_raw'])} / {_kib(s['alone_gzip'])}; "
                f"{_kib(s['batched_raw'])} / {_kib(s['batched_gzip'])}",
                "",
                "",
            )
        )
    syn = result["synthetic"]
    out.append(
        (
            "span_size: bytes per extra document (synthetic, batched) raw / gzip",
            f"{syn['per_document_raw']:.0f} B / {syn['per_document_gzip']:.0f} B",
            "",
            "",
        )
    )
    for key in ("docs_50", "docs_10"):
        c = result["corpus"][key]
        out.append(
            (
                f"span_size: bundled corpus, {c['documents_per_span']:.0f} documents of "
                f"{c['text_chars_per_document']:.0f} chars: alone raw / gzip; batched raw / gzip",
                f"{_kib(c['alone_raw'])} / {_kib(c['alone_gzip'])}; "
                f"{_kib(c['batched_raw'])} / {_kib(c['batched_gzip'])}",
                "",
                "",
            )
        )
    corpus = result["corpus"]
    c50 = corpus["docs_50"]
    out.append(
        (
            "span_size: bundled corpus, bytes per extra document (batched) raw / gzip; "
            "50-document span without document content, batched raw / gzip",
            f"{corpus['per_document_raw']:.0f} B / {corpus['per_document_gzip']:.0f} B; "
            f"{_kib(c50['without_content_batched_raw'])} / "
            f"{_kib(c50['without_content_batched_gzip'])}",
            "",
            "",
        )
    )
    out.append(
        (
            "span_size: bundled corpus 50-document span: attribute key / content / other "
            "string bytes",
            f"{_kib(c50['key_bytes'])} / {_kib(c50['content_bytes'])} / "
            f"{_kib(c50['other_string_bytes'])}",
            "",
            "",
        )
    )
    day = fleet_volumes(syn[f"docs_{DOCS}"]["batched_raw"])[1_000]
    out.append(
        (
            "span_size: a day of 50-document spans at 1,000 reranks/s, raw (synthetic)",
            f"{day / 2**40:.2f} TiB",
            "",
            "",
        )
    )
    return out
