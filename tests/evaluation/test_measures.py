"""Eval metrics against values computed by hand; the readers; the bundled example set."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from retrieval_stage import Candidate, RerankStage
from retrieval_stage.evaluation import (
    MAX_RESAMPLES,
    EvalInputError,
    compare_rankings,
    evaluate,
    paired_permutation_test,
    per_query_scores,
    read_candidates,
    read_qrels,
    read_queries,
)
from retrieval_stage.evaluation.corpus import (
    EXAMPLE_CANDIDATES,
    EXAMPLE_QRELS,
    EXAMPLE_QUERIES,
    build_corpus,
    data_path,
    load_corpus,
)
from retrieval_stage.local import LexicalReranker

# Three judged queries (q4 judges its only document 0: not relevant, so it is left out).
QRELS = {"q1": {"d1": 1}, "q2": {"d5": 1, "d6": 2}, "q3": {"d9": 1}, "q4": {"d1": 0}}
RECALL = {"q1": ["d2", "d1", "d3"], "q2": ["d4", "d5", "d6"], "q3": ["d7", "d8"]}
RERANKED = {"q1": ["d1", "d2", "d3"], "q2": ["d6", "d4", "d5"], "q3": ["d8", "d7"]}


def dcg(gains: list[int]) -> float:
    """trec_eval's DCG: linear gain, log2(rank + 1) discount."""
    return sum(g / math.log2(rank + 1) for rank, g in enumerate(gains, start=1))


def test_metrics_match_hand_computed_values() -> None:
    report = compare_rankings(RECALL, RERANKED, QRELS, recall_at=2)
    assert report.queries == 3
    assert report.unjudged == ["q4"]
    # MRR@10: first relevant at ranks 2, 2, none -> (1/2 + 1/2 + 0) / 3; reranked 1, 1, none.
    assert report.metric("MRR@10").recall == pytest.approx((0.5 + 0.5 + 0) / 3)
    assert report.metric("MRR@10").reranked == pytest.approx((1 + 1 + 0) / 3)
    # nDCG@10 with graded q2: ideal order d6 (2), d5 (1).
    ideal_q2 = dcg([2, 1])
    recall_ndcg = [dcg([0, 1]) / 1.0, dcg([0, 1, 2]) / ideal_q2, 0.0]
    reranked_ndcg = [1.0, dcg([2, 0, 1]) / ideal_q2, 0.0]
    assert report.metric("nDCG@10").recall == pytest.approx(sum(recall_ndcg) / 3)
    assert report.metric("nDCG@10").reranked == pytest.approx(sum(reranked_ndcg) / 3)
    # Recall@2: q1 finds d1 in both; q2 finds one of its two in both; q3 none.
    assert report.metric("Recall@2").recall == pytest.approx((1 + 0.5 + 0) / 3)
    assert report.metric("Recall@2").reranked == pytest.approx((1 + 0.5 + 0) / 3)
    # top-1 accuracy: no query has a relevant first result in recall; q1 and q2 after.
    assert report.metric("top-1 accuracy").recall == 0.0
    assert report.metric("top-1 accuracy").reranked == pytest.approx(2 / 3)
    assert (report.top1_recall, report.top1_reranked) == (0, 2)


def test_p_values_are_the_exact_sign_flip_test() -> None:
    report = compare_rankings(RECALL, RERANKED, QRELS, recall_at=2)
    # MRR differences (0.5, 0.5, 0): of the 8 sign flips, 4 reach |mean| >= 1/3.
    assert report.metric("MRR@10").p_value == pytest.approx(0.5)
    assert report.metric("Recall@2").p_value == 1.0  # no difference at all
    assert report.metric("MRR@10").delta == pytest.approx(1 / 3)


def test_per_query_movement_follows_the_first_relevant_document() -> None:
    report = compare_rankings(RECALL, RERANKED, QRELS, recall_at=2)
    moves = [
        (q.query_id, q.first_relevant_recall, q.first_relevant_reranked, q.movement)
        for q in report.per_query
    ]
    assert moves == [("q1", 2, 1, "↑1"), ("q2", 2, 1, "↑1"), ("q3", None, None, "-")]
    assert report.per_query[0].recall["MRR@10"] == 0.5
    assert report.per_query[0].reranked["MRR@10"] == 1.0


def test_rankings_are_scored_in_the_order_given_even_against_doc_id_order() -> None:
    # trec_eval breaks score ties by document id; ranks must never be re-sorted that way.
    scores = per_query_scores({"q": ["z", "a"]}, {"q": {"z": 1}}, ["q"])
    assert scores["MRR@10"]["q"] == 1.0
    assert scores["top-1 accuracy"]["q"] == 1.0


def test_a_judged_query_without_a_ranking_counts_as_zero() -> None:
    scores = per_query_scores({"q1": ["d1"]}, {"q1": {"d1": 1}, "q2": {"d2": 1}}, ["q1", "q2"])
    assert scores["MRR@10"] == {"q1": 1.0, "q2": 0.0}


def test_permutation_test_edges() -> None:
    assert paired_permutation_test([1.0, 2.0], [1.0, 2.0]) == 1.0
    assert paired_permutation_test([], []) == 1.0
    with pytest.raises(ValueError, match="differ in length"):
        paired_permutation_test([1.0], [1.0, 2.0])
    a = [1.0] * 20 + [0.0] * 10
    b = [0.0] * 30
    first = paired_permutation_test(a, b, resamples=2000, seed=3)
    assert first == paired_permutation_test(a, b, resamples=2000, seed=3)  # reproducible
    assert first < 0.01  # 20 of 30 queries improve, none worsens


def test_permutation_test_memory_does_not_grow_with_resamples() -> None:
    import tracemalloc

    a, b = [1.0] * 20 + [0.0] * 20, [0.0] * 40
    tracemalloc.start()
    try:
        p = paired_permutation_test(a, b, resamples=100_000)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert p < 0.001
    assert peak < 40_000_000  # all 100,000 resamples at once would take ~300 MB


def test_permutation_test_refuses_a_resample_count_out_of_bounds() -> None:
    with pytest.raises(ValueError, match="between 1 and 1,000,000"):
        paired_permutation_test([1.0, 0.0, 1.0], [0.0, 0.0, 0.0], resamples=MAX_RESAMPLES + 1)
    with pytest.raises(ValueError, match="between 1 and"):
        paired_permutation_test([1.0, 0.0, 1.0], [0.0, 0.0, 0.0], resamples=0)


def test_evaluate_reranks_each_judged_query_with_the_stage() -> None:
    queries = {"q1": "delete directory tree", "q2": "unjudged query"}
    qrels = {"q1": {"rmtree": 1}}
    pools = {
        "q1": [
            Candidate("remove", "remove a file", 2.0),
            Candidate("rmtree", "recursively delete a directory tree", 1.0),
        ],
        "q2": [Candidate("x", "x", 1.0)],
    }
    seen: list[str] = []
    report = evaluate(RerankStage(LexicalReranker()), queries, qrels, pools, progress=seen.append)
    assert seen == ["q1"]
    assert report.unjudged == ["q2"]
    assert report.metric("MRR@10").recall == 0.5
    assert report.metric("MRR@10").reranked == 1.0
    assert report.per_query[0].movement == "↑1"


def test_a_reranker_that_ties_every_score_moves_nothing_whatever_the_file_order() -> None:
    queries = {"q1": "anything"}
    qrels = {"q1": {"best": 1}}
    # File order is not recall order: the stage must see the pool best first, so that a
    # reranker's ties (kept in input order) fall back to recall order, not to file order.
    pools = {
        "q1": [
            Candidate("unscored", "x", None),
            Candidate("second", "y", 1.0),
            Candidate("best", "z", 2.0),
        ]
    }
    report = evaluate(RerankStage(LexicalReranker()), queries, qrels, pools)  # all score 0
    (movement,) = report.per_query
    assert (movement.first_relevant_recall, movement.first_relevant_reranked) == (1, 1)
    assert movement.movement == "="
    assert report.metric("MRR@10").delta == 0.0


# -- readers ----------------------------------------------------------------------------------


def write(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_readers_accept_trec_formats(tmp_path: Path) -> None:
    queries = read_queries(write(tmp_path, "q.tsv", "# topics\nq1\tfirst query\nq2\tsecond\n"))
    assert queries == {"q1": "first query", "q2": "second"}
    qrels = read_qrels(write(tmp_path, "qrels", "q1 0 d1 1\nq1 0 d2 0\nq2 Q0 d3 2\n"))
    assert qrels == {"q1": {"d1": 1, "d2": 0}, "q2": {"d3": 2}}
    docs = {"d1": Candidate("d1", "text one"), "d2": Candidate("d2", "text two")}
    run = write(tmp_path, "run", "q1 Q0 d2 1 9.5 bm25\nq1 Q0 d1 2 7.25 bm25\n")
    pools = read_candidates(run, docs)
    assert [(c.id, c.text, c.score) for c in pools["q1"]] == [
        ("d2", "text two", 9.5),
        ("d1", "text one", 7.25),
    ]


def test_readers_accept_json_lines(tmp_path: Path) -> None:
    queries = read_queries(write(tmp_path, "q.jsonl", '{"id": "q1", "text": "hello"}\n'))
    assert queries == {"q1": "hello"}
    qrels = read_qrels(
        write(tmp_path, "r.jsonl", '{"query_id": "q1", "doc_id": "7", "relevance": 2}\n')
    )
    assert qrels == {"q1": {"7": 2}}
    pools = read_candidates(
        write(
            tmp_path,
            "c.jsonl",
            '{"query_id": "q1", "id": "a", "text": "alpha", "score": 1}\n'
            '{"query_id": "q1", "id": "b", "text": "beta", "metadata": {"k": 1}}\n',
        )
    )
    assert [(c.id, c.text, c.score, dict(c.metadata)) for c in pools["q1"]] == [
        ("a", "alpha", 1, {}),
        ("b", "beta", None, {"k": 1}),
    ]


@pytest.mark.parametrize(
    ("reader", "text", "message"),
    [
        (read_queries, "q1\tok\nq2 no tab\n", "line 2: expected <query id><TAB><query text>"),
        (read_queries, "q1\ta\nq1\tb\n", "line 2: query 'q1' appears twice"),
        (read_qrels, "q1 0 d1 1\nq1 0 d1\n", "line 2: expected 4 columns"),
        (read_qrels, "q1 0 d1 yes\n", "line 1: relevance must be an integer, got 'yes'"),
        (read_qrels, "q1 0 d1 1\n\nq1 0 d1 0\n", "line 3: 'd1' is judged twice"),
        (read_qrels, '{"query_id": "q1", "doc_id": "d"\n', "line 1: not valid JSON"),
        (read_candidates, "q1 Q0 d1 1 high run\n", "line 1: score 'high' is not a number"),
        (read_candidates, "q1 Q0 d1 1 2.0 run\n", "line 1: no text for document 'd1'"),
        (
            read_candidates,
            '{"query_id": "q", "id": "a", "text": "x"}\n{"query_id": "q", "id": "a", "text": "y"}',
            "line 2: 'a' is listed twice",
        ),
        (read_candidates, '{"query_id": "q", "id": "a", "text": 3}\n', '"text" must be a string'),
        (
            read_candidates,
            '{"query_id": "q", "id": "a", "text": "x", "metadata": [1, 2]}\n',
            'line 1: "metadata" must be an object or null, got an array',
        ),
        (
            read_candidates,
            '{"query_id": "q", "id": "a", "text": "x", "metadata": "x"}\n',
            'line 1: "metadata" must be an object or null, got a string',
        ),
        (
            read_candidates,
            '{"query_id": "q", "id": "a", "text": "x", "score": 1' + "0" * 400 + "}\n",
            'line 1: "score" must be a finite number or null',
        ),
        (
            read_candidates,
            '{"query_id": "q", "id": "a", "text": "caf\\udce9"}\n',
            'line 1: "text" is not valid Unicode',
        ),
        (read_queries, '{"id": "q", "text": "caf\\udce9"}\n', '"text" is not valid Unicode'),
        (read_qrels, '{"a": ' + "[" * 100_000 + "\n", "line 1: not valid JSON"),
    ],
)
def test_readers_name_the_file_and_line_of_a_bad_line(
    tmp_path: Path, reader: object, text: str, message: str
) -> None:
    path = write(tmp_path, "input", text)
    with pytest.raises(EvalInputError) as raised:
        reader(path)  # type: ignore[operator]
    assert str(raised.value).startswith(f"{path}, ")
    assert message in str(raised.value)


def test_text_that_is_not_utf8_names_the_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "queries.tsv"
    path.write_bytes(b"q1\tfine\nq2\tcaf\xe9\n")
    with pytest.raises(EvalInputError, match=r"queries\.tsv, line 2: not UTF-8 text"):
        read_queries(path)


def test_missing_file_is_an_input_error(tmp_path: Path) -> None:
    with pytest.raises(EvalInputError, match="no such file"):
        read_qrels(tmp_path / "absent")


# -- the bundled corpus and example set -------------------------------------------------------


def test_bundled_corpus_is_real_docstrings_with_unique_ids() -> None:
    corpus = load_corpus()
    ids = [d.id for d in corpus]
    assert len(ids) > 1000
    assert len(set(ids)) == len(ids)
    by_id = {d.id: d for d in corpus}
    assert by_id["json.dumps"].text.startswith("json.dumps: Serialize ``obj`` to a JSON")
    assert by_id["json.dumps"].metadata == {"kind": "function", "module": "json"}
    assert all(d.text.strip() for d in corpus)


def test_example_set_refers_only_to_corpus_documents() -> None:
    ids = {d.id for d in load_corpus()}
    queries = read_queries(data_path(EXAMPLE_QUERIES))
    qrels = read_qrels(data_path(EXAMPLE_QRELS))
    pools = read_candidates(data_path(EXAMPLE_CANDIDATES), {d.id: d for d in load_corpus()})
    assert len(queries) >= 20
    assert set(qrels) == set(queries)
    for qid in queries:
        assert any(grade > 0 for grade in qrels[qid].values()), qid
        assert set(qrels[qid]) <= ids
        assert 0 < len(pools[qid]) <= 50
    assert set(pools) == set(queries)


def test_build_corpus_is_deterministic_and_reads_this_pythons_docstrings() -> None:
    first = build_corpus(["json", "bisect"])
    assert first == build_corpus(["bisect", "json"])
    ids = [d.id for d in first]
    assert ids == sorted(ids, key=lambda i: (i.split(".")[0], i))
    dumps = next(d for d in first if d.id == "json.dumps")
    assert dumps.text.startswith("json.dumps: Serialize ``obj`` to a JSON formatted ``str``")
    assert "json.JSONEncoder.encode" in ids  # public methods of public classes too


def test_corpus_texts_keep_the_lines_of_tables_literal_blocks_and_doctests() -> None:
    from retrieval_stage.evaluation.corpus import _leading_paragraphs

    doc = (
        "Encode things.\n\n"
        "Supports these\ntypes  by default:\n\n"
        "+------+------+\n| a    | b    |\n+======+======+\n\n"
        "Example::\n\n    x = 1\n    y = 2\n\n"
        ">>> f(1)\n2"
    )
    assert _leading_paragraphs(doc) == (
        "Encode things.\n"
        "Supports these types by default:\n"  # prose: whitespace collapsed
        "+------+------+\n| a    | b    |\n+======+======+\n"
        "Example::\n"
        "    x = 1\n    y = 2\n"  # the literal block keeps its lines and indentation
        ">>> f(1)\n2"
    )


def test_keeping_layout_never_changes_which_paragraphs_fit() -> None:
    from retrieval_stage.evaluation.corpus import _leading_paragraphs

    table = "\n".join(["+" + "-" * 30 + "+"] + ["| x" + " " * 28 + "|"] * 20)
    doc = f"First.\n\n{table}\n\nLast words."
    kept = _leading_paragraphs(doc, max_chars=200)
    # The table is ~670 characters as laid out but ~150 of words: it fits, and so does the rest.
    assert kept.splitlines()[1] == "+" + "-" * 30 + "+"
    assert kept.endswith("Last words.")


def test_the_bundled_json_encoder_card_shows_its_table_row_by_row() -> None:
    card = next(d.text for d in load_corpus() if d.id == "json.JSONEncoder")
    assert "\n| dict              | object        |\n" in card
