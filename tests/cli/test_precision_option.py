"""``--precision`` on the commands (issue 48): the embedding model at the precision asked for,
said in the reranker line; refused where it means nothing; ``serve --precision`` says it in
``/info``'s ``model_dtype``. The graphs are built into the test session's own cache
(`tests._int8.cache_home`), as the library builds them in a user's."""

from __future__ import annotations

import json

import httpx
import pytest

from tests._int8 import cache_home, need
from tests.cli.test_commands import flat, run_script
from tests.server.served import server_env, start_server

CANDIDATES = "examples/candidates.jsonl"


@pytest.mark.parametrize("precision", ["int8", "bf16"])
def test_rerank_runs_the_embedding_model_at_the_precision_and_says_so(precision: str) -> None:
    need(precision)
    done = run_script(
        "rerank", "-q", "delete a directory tree", "--input", CANDIDATES,
        "--precision", precision, XDG_CACHE_HOME=str(cache_home()), COLUMNS="200",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    said = flat(done.stderr)
    assert (
        f"with embedding model sentence-transformers/all-MiniLM-L6-v2 (in process, {precision};"
        in said
    )
    ranked = [json.loads(line)["id"] for line in done.stdout.splitlines()]
    assert ranked[0] == "shutil.rmtree"


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("--reranker", "lexical"), "--reranker lexical"),
        (("--endpoint", "http://127.0.0.1:9"), "--endpoint"),
    ],
)
def test_a_precision_that_means_nothing_for_the_reranker_is_refused(
    args: tuple[str, ...], named: str
) -> None:
    done = run_script(
        "rerank", "-q", "q", "--input", CANDIDATES, "--precision", "int8", *args
    )  # fmt: skip
    assert done.returncode == 2
    assert f"--precision int8 is the embedding model's, not {named}'s" in flat(done.stderr)
    assert done.stdout == ""


def test_serve_precision_is_said_in_infos_model_dtype(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    need("int8")
    tmp = tmp_path_factory.mktemp("serve-int8")
    env = server_env(XDG_CACHE_HOME=str(cache_home()))
    with start_server(tmp, "--precision", "int8", "--model-threads", "2", env=env) as served:
        info = httpx.get(served.url + "/info", timeout=30.0).json()
        reply = httpx.post(
            served.url + "/rerank",
            json={"query": "delete a directory tree", "texts": ["bananas", "shutil.rmtree"]},
            timeout=60.0,
        )
    assert info["model_dtype"] == "int8"
    assert reply.status_code == 200
    assert reply.json()[0]["index"] == 1
