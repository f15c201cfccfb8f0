"""The numpy embedding backend (`retrieval_stage.local.bert`): what it refuses, that it never
downloads, and that it embeds as sentence-transformers does.

The refusals and the numerics of GELU need only the ``[local]`` extra; the equality tests
compare with sentence-transformers run in this process and skip where it is not installed
(``make test`` installs it with torch). Equality is checked in CI on a deterministic subset of
the bundled corpus (every 16th document, 97 of 1,538, plus a text past the 256-token cut and
empty ones); ``python -m benchmarks.studies.embedding_backends`` checks the whole corpus and the
eval's MRR@10.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("numpy", reason="the numpy backend needs the [local] extra")
pytest.importorskip("tokenizers", reason="the numpy backend needs the [local] extra")
pytest.importorskip("safetensors", reason="the numpy backend needs the [local] extra")

import numpy as np

from retrieval_stage import RerankError
from retrieval_stage.evaluation.corpus import load_corpus
from retrieval_stage.local import (
    BertEncoder,
    EmbeddingReranker,
    UnsupportedModelError,
    model_source,
)
from retrieval_stage.local import embedding as embedding_module
from retrieval_stage.local.bert import erf, read_model_spec
from retrieval_stage.local.model_source import ModelUnavailableError

from .._minilm import packaged_path

COSINE_FLOOR = 1 - 1e-4
SUBSET_STEP = 16
LONG_TEXT = " ".join(f"word{i} sorts lists in place" for i in range(120))  # > 256 tokens


@functools.cache
def numpy_encoder() -> BertEncoder:
    """The packaged model on the numpy backend, loaded once per session."""
    return BertEncoder.from_directory(packaged_path())


@pytest.fixture
def shared_numpy(monkeypatch: pytest.MonkeyPatch) -> BertEncoder:
    """`EmbeddingReranker(backend="numpy")` gets the session's encoder for the packaged folder."""
    encoder = numpy_encoder()
    real = BertEncoder.from_directory.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(encoder, "max_seq_length", encoder.max_seq_length)  # restored after

    def from_directory(cls: type[BertEncoder], directory: Any) -> BertEncoder:
        same = Path(directory).resolve() == Path(packaged_path()).resolve()
        return encoder if same else real(cls, directory)

    monkeypatch.setattr(BertEncoder, "from_directory", classmethod(from_directory))
    return encoder


def model_copy(tmp_path: Path, edit: dict[str, Any] | None = None) -> Path:
    """The packaged folder's configuration files copied (no weights), `edit` applied:
    file name → new JSON content (None: the file is removed)."""
    source = Path(packaged_path())
    target = tmp_path / "model"
    (target / "1_Pooling").mkdir(parents=True)
    for name in ("config.json", "modules.json", "sentence_bert_config.json", "tokenizer.json"):
        shutil.copy(source / name, target / name)
    shutil.copy(source / "1_Pooling" / "config.json", target / "1_Pooling" / "config.json")
    for name, content in (edit or {}).items():
        path = target / name
        if content is None:
            path.unlink()
        else:
            path.write_text(json.dumps(content), encoding="utf-8")
    return target


def packaged_json(name: str) -> Any:
    return json.loads((Path(packaged_path()) / name).read_text(encoding="utf-8"))


# -- what the model folder says, read rather than assumed -------------------------------------


def test_the_packaged_model_is_read_from_its_own_files() -> None:
    spec = read_model_spec(packaged_path())
    assert (spec.layers, spec.hidden, spec.heads) == (6, 384, 12)
    assert spec.layer_norm_eps == 1e-12
    assert spec.max_seq_length == 256  # sentence_bert_config.json, not tokenizer.json's 128
    assert spec.normalize  # modules.json lists Normalize
    assert spec.prompt("query") == spec.prompt("document") == ""


def test_max_seq_length_and_eps_follow_the_files(tmp_path: Path) -> None:
    config = packaged_json("config.json") | {"layer_norm_eps": 1e-5}
    folder = model_copy(tmp_path, {"config.json": config, "sentence_bert_config.json": None})
    spec = read_model_spec(folder)
    assert spec.layer_norm_eps == 1e-5
    assert spec.max_seq_length == 512  # no sentence_bert_config: the position table's length


def test_without_normalize_in_modules_json_embeddings_are_not_normalised(tmp_path: Path) -> None:
    modules = packaged_json("modules.json")[:2]
    assert not read_model_spec(model_copy(tmp_path, {"modules.json": modules})).normalize


@pytest.mark.parametrize(
    ("file", "change", "named"),
    [
        ("config.json", {"model_type": "roberta", "architectures": ["RobertaModel"]}, "roberta"),
        ("config.json", {"architectures": ["BertForSequenceClassification"]}, "BertForSeq"),
        ("config.json", {"hidden_act": "gelu_new"}, "gelu_new"),
        ("config.json", {"position_embedding_type": "relative_key"}, "relative_key"),
        ("config.json", {"is_decoder": True}, "decoder"),
        (
            "1_Pooling/config.json",
            {"pooling_mode_mean_tokens": False, "pooling_mode_cls_token": True},
            "pooling_mode_cls_token",
        ),
        ("1_Pooling/config.json", {"pooling_mode_max_tokens": True}, "pooling_mode_max_tokens"),
    ],
)
def test_a_model_it_does_not_implement_is_refused_naming_what_was_found(
    tmp_path: Path, file: str, change: dict[str, Any], named: str
) -> None:
    folder = model_copy(tmp_path, {file: packaged_json(file) | change})
    with pytest.raises(UnsupportedModelError, match=named) as caught:
        read_model_spec(folder)
    assert "[torch]" in str(caught.value)
    assert isinstance(caught.value, RerankError)  # a stage falls back; the command says why


def test_modules_beyond_transformer_pooling_normalize_are_refused(tmp_path: Path) -> None:
    dense = {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"}
    modules = [*packaged_json("modules.json")[:2], dense]
    with pytest.raises(UnsupportedModelError, match=r"models\.Dense"):
        read_model_spec(model_copy(tmp_path, {"modules.json": modules}))


def test_missing_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(UnsupportedModelError, match=r"no modules\.json"):
        read_model_spec(model_copy(tmp_path / "a", {"modules.json": None}))
    folder = model_copy(tmp_path / "b")  # every config, but no model.safetensors
    with pytest.raises(UnsupportedModelError, match=r"no model\.safetensors"):
        BertEncoder.from_directory(folder)


def test_the_reranker_refuses_it_at_load_with_the_same_message(tmp_path: Path) -> None:
    folder = model_copy(tmp_path, {"config.json": {"model_type": "t5"}})
    reranker = EmbeddingReranker(folder, backend="numpy")
    with pytest.raises(UnsupportedModelError, match="model_type 't5'"):
        reranker.load()


# -- never a download ------------------------------------------------------------------------


def test_a_hub_name_not_on_disk_is_refused_without_asking_the_hub(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)

    def no_hub(*args: Any, **kwargs: Any) -> bool:
        raise AssertionError("the numpy backend asked the hub")

    monkeypatch.setattr(model_source, "hub_answers", no_hub)
    reranker = EmbeddingReranker("example-org/never-downloaded", backend="numpy")
    with pytest.raises(ModelUnavailableError, match="never downloads"):
        reranker.load()


# -- backend choice --------------------------------------------------------------------------


def test_the_backend_is_chosen_by_argument_then_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(embedding_module.BACKEND_ENV, "numpy")
    assert EmbeddingReranker().backend == "numpy"
    monkeypatch.setenv(embedding_module.BACKEND_ENV, "tensorflow")
    with pytest.raises(ValueError, match="RETRIEVAL_STAGE_EMBEDDING_BACKEND must be one of"):
        EmbeddingReranker()
    assert EmbeddingReranker(backend="numpy").backend == "numpy"
    with pytest.raises(ValueError, match="CPU only"):
        EmbeddingReranker(backend="numpy", device="cuda")


def test_auto_takes_numpy_without_sentence_transformers_and_says_which_extra_is_missing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(embedding_module.BACKEND_ENV, raising=False)
    monkeypatch.setattr(embedding_module.base, "local_available", lambda: False)
    assert EmbeddingReranker().backend == "numpy"
    with pytest.raises(ImportError, match=r"\[torch\]"):
        EmbeddingReranker(backend="sentence-transformers")
    monkeypatch.setattr(embedding_module.base, "light_embedding_available", lambda: False)
    with pytest.raises(ImportError, match=r"\[local\]"):
        EmbeddingReranker()


# -- numerics --------------------------------------------------------------------------------


def test_erf_is_exact_to_float32_precision() -> None:
    xs = np.linspace(-6.0, 6.0, 24_001, dtype=np.float32)
    expected = np.array([math.erf(float(x)) for x in xs])
    assert np.abs(erf(xs.copy()).astype(np.float64) - expected).max() < 1e-6


def test_embeddings_are_unit_length_rows_in_input_order(shared_numpy: BertEncoder) -> None:
    texts = ["short", LONG_TEXT, "Bananas are a yellow fruit.", "short"]
    vectors = shared_numpy.embed(texts, batch_size=2)  # batches sorted by length, then put back
    assert vectors.shape == (4, 384)
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    assert np.array_equal(vectors[0], vectors[3])
    alone = shared_numpy.embed(["Bananas are a yellow fruit."])[0]
    assert float(vectors[2] @ alone) > 1 - 1e-6  # its neighbours in a batch change nothing


def test_a_packed_batch_embeds_each_text_as_it_would_alone(shared_numpy: BertEncoder) -> None:
    # A batch packs its texts' tokens one after another, unpadded: positions restart and
    # attention stays within each text, whatever the lengths around it.
    texts = ["a", LONG_TEXT, "sort a list in place", "", "Bananas are a yellow fruit. " * 9]
    together = shared_numpy.embed(texts, batch_size=len(texts))
    for text, vector in zip(texts, together, strict=True):
        assert float(vector @ shared_numpy.embed([text])[0]) > 1 - 1e-6, text[:20]


def test_tokens_past_max_seq_length_are_cut(shared_numpy: BertEncoder) -> None:
    assert len(shared_numpy.tokenizer.encode(LONG_TEXT).ids) == 256
    whole = shared_numpy.embed([LONG_TEXT])[0]
    reranker = EmbeddingReranker(backend="numpy", max_length=16)  # the shared encoder, cut
    reranker.load()
    assert reranker.max_input_length == 16
    assert len(reranker.tokenizer.encode(LONG_TEXT).ids) == 16
    assert float(reranker.embed_query(LONG_TEXT) @ whole) < 0.999  # fewer tokens read


# -- equal to sentence-transformers ----------------------------------------------------------


@functools.cache
def reference_model() -> Any:
    pytest.importorskip(
        "sentence_transformers", reason="equality is checked against sentence-transformers"
    )
    from .._minilm import packaged_model

    return packaged_model()


def test_corpus_embeddings_equal_sentence_transformers(shared_numpy: BertEncoder) -> None:
    model = reference_model()
    texts = [*[d.text for d in load_corpus()][::SUBSET_STEP], LONG_TEXT, "", "  \n "]
    reranker = EmbeddingReranker(backend="numpy")
    ours = reranker.embed_documents(texts)
    theirs = model.encode_document(
        texts, batch_size=32, convert_to_numpy=True, normalize_embeddings=True
    )
    cosines = np.sum(ours * theirs, axis=1)
    assert cosines.min() >= COSINE_FLOOR, f"lowest cosine {cosines.min()}"
    queries = ["how do I sort a list in place", "parse a date string"]
    assert np.sum(reranker.embed_queries(queries) * model.encode_query(queries), axis=1).min() >= (
        COSINE_FLOOR
    )


def test_rerank_scores_and_order_match_sentence_transformers(shared_numpy: BertEncoder) -> None:
    from .._minilm import reference_cosines

    reference_model()
    query = "how do I sort a list in place"
    texts = [d.text for d in load_corpus()][3::193]
    expected = reference_cosines(query, texts)
    items = [{"n": i, "body": t} for i, t in enumerate(texts)]
    result = EmbeddingReranker(backend="numpy").rerank(query, items, text=lambda d: d["body"])
    order = [item["n"] for item, _ in result]
    assert order != list(range(len(texts))), "input order must not be the answer"
    for better, worse in itertools.pairwise(order):  # best first, as sentence-transformers ranks
        assert expected[better] >= expected[worse] - 1e-5
    for item, score in result:
        assert item is items[item["n"]]
        assert score == pytest.approx(expected[item["n"]], abs=1e-4)
