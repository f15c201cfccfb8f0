"""Tables that never cut numbers, and one rule for ids, texts and scores in every reader."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from retrieval_stage.cli.render import changes_table
from retrieval_stage.evaluation import EvalInputError, read_candidates, read_qrels
from retrieval_stage.evaluation.corpus import load_corpus
from retrieval_stage.jsonl import JsonLineError, candidate_fields, json_lines
from retrieval_stage.models import Candidate, Reranked
from retrieval_stage.pipeline import compare_ranks

from .test_commands import (
    flat,
    invoke,
)


def rendered(width: int, ident: str, score: float, recall: float) -> str:
    candidates = [Candidate(ident, "a long text " * 20, recall), Candidate("b", "short", 0.5)]
    outputs = [Reranked(candidates[0], score, 0), Reranked(candidates[1], 0.25, 1)]
    console = Console(file=io.StringIO(), width=width, record=True, color_system=None)
    table = changes_table(
        compare_ranks(candidates, outputs),
        score_label="score",
        recall_label="recall score",
        width=width,
    )
    console.print(table)
    return console.export_text()


def test_an_80_column_table_keeps_every_number_and_shrinks_the_id_and_snippet() -> None:
    text = rendered(80, "a-very-long-document-identifier-" * 3, 123456.789, 98765.4321)
    assert "1.235e+05" in text
    assert "9.877e+04" in text
    assert "…" in text  # the id or the snippet gave way
    assert all(len(line) <= 80 for line in text.splitlines())


def test_column_names_are_unique() -> None:
    header = rendered(120, "a", 0.5, 0.25).splitlines()[0]
    names = [name.strip() for name in header.split("┃")]
    assert len(names) == len(set(names))
    assert "recall rank" in names
    assert "recall score" in names


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ('{"id": 7, "text": "t"}', '"id" must be a string, got the number 7 (write "7"'),
        ('{"id": "", "text": "t"}', '"id" must not be empty'),
        ('{"id": "a", "text": "  "}', '"text" must not be empty'),
        ('{"id": "a", "text": "t", "score": NaN}', '"score": NaN is not a score'),
        ('{"id": "a", "text": "t", "score": -Infinity}', '"score": -Infinity is not a score'),
        ('{"id": "a", "text": "t", "score": 1e999}', '"score": Infinity is not a score'),
    ],
)
def test_rerank_input_refuses_with_the_line_named(line: str, message: str) -> None:
    result = invoke(
        "rerank", "-q", "q", "--reranker", "lexical", stdin='{"id": "ok", "text": "t"}\n' + line
    )
    assert result.exit_code == 2
    assert f"line 2: {message}" in flat(result.stderr)
    assert result.stdout == ""


def test_the_same_rule_in_eval_corpus_and_the_shared_parser(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="got the number 7"):
        candidate_fields({"id": 7, "text": "t"})
    qrels = tmp_path / "qrels.jsonl"
    qrels.write_text(json.dumps({"query_id": "q1", "doc_id": 7, "relevance": 1}) + "\n")
    with pytest.raises(EvalInputError, match=r"line 1: .*got the number 7"):
        read_qrels(qrels)
    run = tmp_path / "candidates.jsonl"
    run.write_text(json.dumps({"query_id": "q1", "id": "d", "text": "t", "score": 7}) + "\n")
    run.write_text(run.read_text() + '{"query_id": "q1", "id": "e", "text": "t", "score": NaN}\n')
    with pytest.raises(EvalInputError, match=r"line 2: .*NaN is not a score"):
        read_candidates(run)
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text('{"id": "a", "text": "t"}\n\n{"id": "", "text": "t"}\n')
    with pytest.raises(JsonLineError, match='line 3: "id" must not be empty'):
        load_corpus(corpus)


def test_json_lines_numbers_lines_and_skips_blanks() -> None:
    assert list(json_lines(['{"a": 1}', "", '{"b": 2}'])) == [(1, {"a": 1}), (3, {"b": 2})]
    with pytest.raises(JsonLineError, match="line 2: expected a JSON object, got an array"):
        list(json_lines(['{"a": 1}', "[1]"]))


def test_the_bundled_corpus_loads_through_the_shared_reader() -> None:
    documents = load_corpus()
    assert len(documents) > 1000
    assert len({d.id for d in documents}) == len(documents)


def test_eval_candidates_lists_every_bad_line_as_rerank_does(tmp_path: Path) -> None:
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tfirst\n", encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 a 1\n", encoding="utf-8")
    candidates = tmp_path / "candidates.jsonl"
    candidates.write_text(
        '{"query_id": "q1", "id": "a", "text": "alpha"}\n'
        '{"query_id": "q1", "id": "b", "text": }\n'
        '{"query_id": "q1", "id": "c", "text": "gamma"}\n'
        '{"query_id": "q1", "id": "zz"}\n'
        '{"query_id": "q1", "id": "a", "text": "alpha again"}\n'
        '{"query_id": "q1", "id": 7, "text": "seven"}\n',
        encoding="utf-8",
    )
    docs = tmp_path / "docs.jsonl"
    docs.write_text('{"id": "a", "text": "alpha"}\n', encoding="utf-8")
    result = invoke(
        "eval", "--queries", str(queries), "--qrels", str(qrels), "--candidates",
        str(candidates), "--docs", str(docs), "--reranker", "lexical",
    )  # fmt: skip
    assert result.exit_code == 2
    assert result.stdout == ""
    assert result.stderr.splitlines() == [
        f"error: --candidates {candidates}: 4 bad lines, nothing reranked",
        "  line 2: not valid JSON: Expecting value (column 39)",
        "  line 4: no text for document 'zz' (give it, or pass its corpus)",
        "  line 5: 'a' is listed twice for query 'q1' (first on line 1)",
        '  line 6: "id" must be a string, got the number 7 (write "7": ids are kept as given, '
        "never converted)",
    ]
