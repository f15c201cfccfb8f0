"""LlamaIndex's own TEI client against `retrieval-stage serve` as it starts by default (issue 41).

`llama_index.postprocessor.tei_rerank.TextEmbeddingInference` is a client nobody here wrote: it
posts every candidate in one request and cannot split a call, so a server cap below the request
size breaks it (at the old default cap of 32 it failed with a bare ``AssertionError`` at 50 and
100 candidates). `serve` with no options must serve the common 10-100 candidates in one call,
and every node must get the server's own score for its text.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

pytest.importorskip(
    "llama_index.postprocessor.tei_rerank",
    reason="llama-index-postprocessor-tei-rerank is not installed (tests/integrations/setup.sh)",
)
pytest.importorskip("uvicorn", reason="`serve` needs the [server] extra")

from llama_index.core.schema import NodeWithScore, QueryBundle, TextNode
from llama_index.postprocessor.tei_rerank import TextEmbeddingInference

from .._minilm import need_numpy_backend
from ..server.served import Served, start_server

QUERY = "how do I parse json in python"
TOP_N = 5


@pytest.fixture(scope="module")
def default_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """`retrieval-stage serve` with no option but its port: the default reranker and caps."""
    need_numpy_backend()
    with start_server(tmp_path_factory.mktemp("tei-llama")) as served:
        yield served


def candidates(n: int) -> list[NodeWithScore]:
    topics = ["json", "parsing", "python", "rust", "bananas", "files", "http", "yaml"]
    return [
        NodeWithScore(
            node=TextNode(id_=f"n{i}", text=f"note {i}: {topics[i % 8]} and {topics[(i * 3) % 8]}"),
            score=1.0 - i / n,
        )
        for i in range(n)
    ]


@pytest.mark.parametrize("n", [10, 50, 100])
def test_llama_indexs_tei_postprocessor_reranks_n_candidates_against_the_defaults(
    default_server: Served, n: int, tmp_path: Path
) -> None:
    nodes = candidates(n)
    texts = [node.node.get_content() for node in nodes]
    reranker = TextEmbeddingInference(base_url=default_server.url, top_n=TOP_N, timeout=120.0)
    kept = reranker.postprocess_nodes(nodes, query_bundle=QueryBundle(QUERY))

    # The server's own answer for the same request, by index.
    answer = httpx.post(
        default_server.url + "/rerank", json={"query": QUERY, "texts": texts}, timeout=120.0
    )
    assert answer.status_code == 200, answer.text
    by_index = {r["index"]: r["score"] for r in answer.json()}
    assert sorted(by_index) == list(range(n))

    # Every node (LlamaIndex sets them in place) carries its own text's score...
    for i, node in enumerate(nodes):
        assert node.node.get_content() == texts[i]
        assert node.score == pytest.approx(by_index[i], abs=1e-6), node.node.node_id
    # ...and the kept ones are the best TOP_N, best first.
    best = sorted(range(n), key=lambda i: -by_index[i])[:TOP_N]
    assert [node.node.node_id for node in kept] == [f"n{i}" for i in best]
