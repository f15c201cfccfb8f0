"""The local cross-encoder through its real loading code, on a tiny model built here.

No hub download: each test session writes a two-layer BERT cross-encoder (hidden size 32, a
vocabulary of a few words) with ``save_pretrained`` and loads it from that directory exactly as
a user's ``--model DIR`` would be loaded.
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip(
    "sentence_transformers",
    reason="the local cross-encoder needs the [local] extra: "
    "pip install 'torch==2.13.0+cpu' 'sentence-transformers>=3'",
)

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from retrieval_stage import Candidate, RerankError, RerankStage
from retrieval_stage.local import CrossEncoderReranker

WORDS = [
    *("what", "is", "rust", "a", "language", "bananas", "are", "yellow", "fruit", "the"),
    *("compiler", "checks", "memory", "safety", "python", "snakes", "garbage", "collector"),
]
QUERY = "what is rust"
TEXTS = [
    "bananas are yellow fruit",
    "rust is a language",
    "python snakes",
    "the compiler checks memory safety",
]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A randomly initialised BERT cross-encoder saved like a downloaded one."""
    import torch
    from transformers import BertConfig, BertForSequenceClassification, BertTokenizer

    directory = tmp_path_factory.mktemp("models") / "tiny-cross-encoder"
    directory.mkdir()
    vocab = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]
    (directory / "vocab.txt").write_text("\n".join(vocab) + "\n", encoding="utf-8")
    if "vocab" in inspect.signature(BertTokenizer.__init__).parameters:  # transformers >= 5
        tokenizer = BertTokenizer(vocab={w: i for i, w in enumerate(vocab)})
    else:
        tokenizer = BertTokenizer(vocab_file=str(directory / "vocab.txt"))
    assert "[UNK]" not in tokenizer.tokenize(" ".join(WORDS))
    torch.manual_seed(7)
    config = BertConfig(
        vocab_size=len(vocab),
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        num_labels=1,
        initializer_range=0.5,  # wide random weights, so every text scores clearly apart
    )
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


def reference_scores(directory: Path, query: str, texts: list[str]) -> list[float]:
    """Each text's score computed with transformers directly, one pair at a time."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(directory)
    model = AutoModelForSequenceClassification.from_pretrained(directory).eval()
    scores = []
    with torch.no_grad():
        for text in texts:
            logits = model(**tokenizer(query, text, return_tensors="pt")).logits
            scores.append(float(torch.sigmoid(logits).reshape(-1)[0]))
    return scores


def test_scores_from_a_model_directory_map_to_their_own_items(tiny_model: Path) -> None:
    expected = reference_scores(tiny_model, QUERY, TEXTS)
    assert len({round(s, 4) for s in expected}) == len(TEXTS), "scores must differ to test"
    best_first = sorted(range(len(TEXTS)), key=lambda i: -expected[i])
    assert best_first != list(range(len(TEXTS))), "input order must not be the answer"
    items = [{"n": i, "t": t} for i, t in enumerate(TEXTS)]

    reranker = CrossEncoderReranker(tiny_model, local_files_only=True)
    result = reranker.rerank(QUERY, items, text=lambda d: d["t"])

    assert [item["n"] for item, _ in result] == best_first
    for item, score in result:
        assert item is items[item["n"]]
        assert score == pytest.approx(expected[item["n"]], abs=1e-5)


def test_top_k_keeps_the_best_and_empty_input_loads_nothing(tiny_model: Path) -> None:
    reranker = CrossEncoderReranker(tiny_model, local_files_only=True)
    assert reranker.rerank(QUERY, []) == []
    assert reranker._encoder is None
    full = reranker.rerank(QUERY, TEXTS)
    assert reranker.rerank(QUERY, TEXTS, top_k=2) == full[:2]


def test_model_name_is_the_directory_name_and_provider_is_local(tiny_model: Path) -> None:
    reranker = CrossEncoderReranker(tiny_model)
    assert reranker.model_name == "tiny-cross-encoder"
    assert reranker.provider == "local"


def test_stage_span_names_the_local_provider_and_model(tiny_model: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    provider.add_span_processor(SimpleSpanProcessor(exporter))
    candidates = [Candidate(f"d{i}", t, score=1.0 - i / 10) for i, t in enumerate(TEXTS)]
    stage = RerankStage(
        CrossEncoderReranker(tiny_model, local_files_only=True), tracer_provider=provider
    )
    out = stage.run(QUERY, candidates)
    assert {r.candidate.id for r in out} == {c.id for c in candidates}
    assert all(r.reranked for r in out)
    (span,) = exporter.get_finished_spans()
    attributes: dict[str, Any] = dict(span.attributes or {})
    assert attributes["retrieval_stage.provider"] == "local"
    assert attributes["reranker.model_name"] == "tiny-cross-encoder"
    assert attributes["retrieval_stage.fallback"] is False


def test_a_model_that_cannot_load_raises_rerank_error(tmp_path: Path) -> None:
    missing = tmp_path / "no-such-model"
    reranker = CrossEncoderReranker(missing, local_files_only=True)
    with pytest.raises(RerankError, match="could not load cross-encoder"):
        reranker.rerank(QUERY, TEXTS)


def test_stage_falls_back_to_recall_order_when_the_model_cannot_load(tmp_path: Path) -> None:
    candidates = [Candidate("a", "x", 0.2), Candidate("b", "y", 0.9)]
    stage = RerankStage(CrossEncoderReranker(tmp_path / "missing", local_files_only=True))
    out = stage.run(QUERY, candidates)
    assert [(r.candidate.id, r.reranked) for r in out] == [("b", False), ("a", False)]


def test_command_runs_the_local_cross_encoder_from_a_model_directory(
    tiny_model: Path, tmp_path: Path
) -> None:
    import structlog
    from typer.testing import CliRunner

    from retrieval_stage.cli import app

    trace_file = tmp_path / "trace.jsonl"
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(
        "".join(f'{{"id": "d{i}", "text": "{t}"}}\n' for i, t in enumerate(TEXTS)),
        encoding="utf-8",
    )
    result = CliRunner().invoke(
        app,
        ["demo", "what is rust language", "--corpus", str(corpus), "--reranker", "local",
         "--model", str(tiny_model), "--trace-file", str(trace_file)],
        env={"HF_HUB_OFFLINE": "1", "COLUMNS": "160"},
    )  # fmt: skip
    structlog.reset_defaults()  # the command configured logging to the runner's stream
    assert result.exit_code == 0, result.stderr
    assert "reranker: local cross-encoder tiny-cross-encoder (in process)" in result.stdout
    assert "pip install" not in result.stdout
    spans = [
        span
        for line in trace_file.read_text(encoding="utf-8").splitlines()
        for resource in json.loads(line)["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    (rerank,) = [s for s in spans if s["name"] == "rerank"]
    attributes = {a["key"]: a["value"] for a in rerank["attributes"]}
    assert attributes["retrieval_stage.provider"] == {"stringValue": "local"}
    assert attributes["reranker.model_name"] == {"stringValue": "tiny-cross-encoder"}


async def test_async_twin_scores_in_a_thread_and_maps_the_same(tiny_model: Path) -> None:
    from retrieval_stage.local import AsyncCrossEncoderReranker

    expected = reference_scores(tiny_model, QUERY, TEXTS)
    reranker = AsyncCrossEncoderReranker(tiny_model, local_files_only=True)
    result = await reranker.rerank(QUERY, TEXTS, top_k=2)
    best_two = sorted(range(len(TEXTS)), key=lambda i: -expected[i])[:2]
    assert [t for t, _ in result] == [TEXTS[i] for i in best_two]
    assert reranker.provider == "local"
    assert reranker.model_name == tiny_model.name


# -- what is refused as a cross-encoder ------------------------------------------------------


def test_the_packaged_bi_encoder_is_refused_as_a_cross_encoder() -> None:
    from retrieval_stage.local.model_source import NotACrossEncoderError

    from .._minilm import packaged_path

    for model in (packaged_path(), "sentence-transformers/all-MiniLM-L6-v2"):
        with pytest.raises(NotACrossEncoderError) as caught:
            CrossEncoderReranker(model)
        message = str(caught.value)
        assert "no trained sequence-classification head" in message
        assert "EmbeddingReranker" in message
        assert "--reranker embedding" in message
    assert issubclass(NotACrossEncoderError, ValueError)


def test_a_plain_encoder_directory_is_refused(tmp_path: Path, tiny_model: Path) -> None:
    from retrieval_stage.local.model_source import NotACrossEncoderError, check_cross_encoder

    plain = tmp_path / "plain"
    plain.mkdir()
    config = json.loads((tiny_model / "config.json").read_text(encoding="utf-8"))
    (plain / "config.json").write_text(
        json.dumps({**config, "architectures": ["BertModel"]}), encoding="utf-8"
    )
    with pytest.raises(NotACrossEncoderError, match=r"plain encoder.*\(BertModel\)"):
        check_cross_encoder(plain)
    with pytest.raises(NotACrossEncoderError):
        CrossEncoderReranker(plain, local_files_only=True)


def test_a_trained_cross_encoder_is_accepted(tmp_path: Path, tiny_model: Path) -> None:
    from retrieval_stage.local.model_source import check_cross_encoder

    check_cross_encoder(tiny_model)  # architectures: BertForSequenceClassification
    sentence_transformers_cross_encoder = tmp_path / "st-cross-encoder"
    sentence_transformers_cross_encoder.mkdir()
    (sentence_transformers_cross_encoder / "config_sentence_transformers.json").write_text(
        json.dumps({"model_type": "CrossEncoder"}), encoding="utf-8"
    )
    (sentence_transformers_cross_encoder / "config.json").write_text(
        json.dumps({"architectures": ["SomethingNew"]}), encoding="utf-8"
    )
    check_cross_encoder(sentence_transformers_cross_encoder)
    check_cross_encoder(tmp_path)  # no config at all: the loader judges
    assert CrossEncoderReranker(tiny_model, local_files_only=True).rerank(QUERY, TEXTS)


def test_a_cross_encoder_not_on_disk_fails_fast_when_offline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrieval_stage.local.model_source import ModelUnavailableError

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    reranker = CrossEncoderReranker("someone/not-downloaded-cross-encoder")
    with pytest.raises(
        ModelUnavailableError, match=r"could not load cross-encoder.*HF_HUB_OFFLINE"
    ):
        reranker.load()
