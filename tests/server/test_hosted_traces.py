"""``/v2/rerank`` and ``/v1/rerank`` are traced and metered as ``/rerank`` is: a SERVER span per
request named after its route and continuing the caller's ``traceparent``, its ``rerank.batch``
child, and the request-duration histogram under the API's shape with the status answered,
read back from a real server over OTLP/HTTP on loopback.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
    ExportMetricsServiceRequest,
)

from tests.otlp_receivers import http_receiver

from .served import server_env, start_server
from .test_traces import INGEST_SECONDS, Exported, exported_spans

MODEL = "lexical-coverage-proximity"
TRACES = {
    "/v2/rerank": "0af7651916cd43dd8448eb211c80319c",
    "/v1/rerank": "1bf7651916cd43dd8448eb211c80319d",
}
PARENT = "b7ad6b7169203331"


def _attributes(kvs: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for kv in kvs:
        which = kv.value.WhichOneof("value")
        out[kv.key] = getattr(kv.value, which) if which else None
    return out


def _durations(bodies: list[bytes]) -> list[tuple[str, int, int]]:
    """(shape, status, count) of every request-duration data point exported."""
    points = []
    for body in bodies:
        request = ExportMetricsServiceRequest.FromString(body)
        for resource_metrics in request.resource_metrics:
            for scope_metrics in resource_metrics.scope_metrics:
                for metric in scope_metrics.metrics:
                    if metric.name != "retrieval_stage.server.request.duration":
                        continue
                    for point in metric.histogram.data_points:
                        a = _attributes(point.attributes)
                        points.append(
                            (
                                a["retrieval_stage.shape"],
                                a["http.response.status_code"],
                                point.count,
                            )
                        )
    return points


def test_each_hosted_route_has_its_server_span_batch_span_and_metrics(tmp_path: Path) -> None:
    with http_receiver() as receiver:
        env = server_env(OTEL_EXPORTER_OTLP_ENDPOINT=receiver.url, OTEL_BSP_SCHEDULE_DELAY="100")
        with start_server(tmp_path, "--reranker", "lexical", env=env) as served:
            for path, trace_id in TRACES.items():
                reply = httpx.post(
                    served.url + path,
                    json={"model": MODEL, "query": "q", "documents": ["a q", "b", "c q"]},
                    headers={"traceparent": f"00-{trace_id}-{PARENT}-01"},
                    timeout=30.0,
                )
                assert reply.status_code == 200, reply.text
                wrong = httpx.post(
                    served.url + path,
                    json={"model": "other", "query": "q", "documents": ["a"]},
                    timeout=30.0,
                )
                assert wrong.status_code == 404
            deadline = time.monotonic() + INGEST_SECONDS
            while True:
                spans = exported_spans(receiver)
                wanted = {s.span.trace_id.hex() for s in spans if s.span.name == "rerank.batch"}
                if set(TRACES.values()) <= wanted or time.monotonic() > deadline:
                    break
                time.sleep(0.1)
            assert served.stop() == 0, served.log_text()[-2000:]
        for path, trace_id in TRACES.items():
            trace = [s for s in spans if s.span.trace_id.hex() == trace_id]
            (server,) = [s for s in trace if s.span.name == f"POST {path}"]
            (batch,) = [s for s in trace if s.span.name == "rerank.batch"]
            _check(server, batch, path)
        points = _durations(receiver.received("/v1/metrics"))
    for shape in ("cohere", "jina"):
        assert (shape, 200, 1) in points, points
        assert (shape, 404, 1) in points, points


def _check(server: Exported, batch: Exported, path: str) -> None:
    assert server.span.parent_span_id.hex() == PARENT, "the caller's trace continued"
    assert server.span.kind == server.span.SPAN_KIND_SERVER
    assert batch.span.parent_span_id == server.span.span_id
    attributes = server.attributes
    assert attributes["http.route"] == path
    assert attributes["retrieval_stage.shape"] == ("cohere" if path == "/v2/rerank" else "jina")
    assert attributes["retrieval_stage.documents"] == 3
    assert attributes["retrieval_stage.model"] == MODEL
    assert batch.attributes["retrieval_stage.batch.request_pairs"] == 3
