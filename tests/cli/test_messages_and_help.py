"""What a new user reads (issue 27): messages that say what to do, help that fits a screen.

Each test names the point of the issue it guards.
"""

from __future__ import annotations

import pickle

import pytest

from retrieval_stage import RerankClient
from retrieval_stage.cli.render import changes_table
from retrieval_stage.cli.reranker import reason_text
from retrieval_stage.errors import RerankProtocolError, RerankStatusError
from retrieval_stage.validate import InvalidSetting

from ..conftest import WireMock
from .test_commands import CANDIDATES, flat, invoke, run_script

# -- 7: an endpoint without a scheme; a 404 names the URL ----------------------------------


@pytest.mark.parametrize("endpoint", ["localhost:8080", "127.0.0.1:8080/tei", "rerank.example"])
def test_an_endpoint_without_a_scheme_says_add_http(endpoint: str) -> None:
    with pytest.raises(InvalidSetting, match=r"add http:// \(e\.g\. http://localhost:8080\)"):
        RerankClient(endpoint)
    result = invoke("rerank", "-q", "q", "--endpoint", endpoint, stdin=CANDIDATES)
    assert result.exit_code == 2
    assert "add http://" in flat(result.stderr)
    assert "scheme" not in result.stderr


def test_another_scheme_is_still_named() -> None:
    with pytest.raises(InvalidSetting, match="got scheme 'ftp'"):
        RerankClient("ftp://localhost:8080")


def test_a_404_names_the_url_requested_and_the_doubled_path(wm: WireMock) -> None:
    wm.stub_json("/tei/rerank/rerank", {"error": "no route"}, status=404)
    with RerankClient(wm.url + "/tei/rerank") as client, pytest.raises(RerankStatusError) as got:
        client.rerank("q", ["a"])
    assert got.value.url == f"{wm.url}/tei/rerank/rerank"
    assert f"tei answered HTTP 404 for {wm.url}/tei/rerank/rerank" in str(got.value)
    copy = pickle.loads(pickle.dumps(got.value))
    assert (copy.url, str(copy)) == (got.value.url, str(got.value))

    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/tei/rerank", stdin=CANDIDATES)
    said = flat(result.stderr)
    assert result.exit_code == 1
    assert f"{wm.url}/tei/rerank/rerank answered HTTP 404" in said
    assert "--endpoint already ends in /rerank" in said
    assert f"--endpoint {wm.url}/tei" in said


def test_a_500_does_not_repeat_the_url() -> None:
    error = RerankStatusError(500, "boom", provider="tei", url="http://h/rerank")
    assert str(error) == "tei answered HTTP 500: boom"


# -- 8: wording ------------------------------------------------------------------------------


def test_a_protocol_error_is_said_once(wm: WireMock) -> None:
    wm.stub_json("/tei/rerank", {"not": "a list"})
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/tei", stdin=CANDIDATES)
    said = flat(result.stderr)
    assert result.exit_code == 1
    assert said.count("answered something that is not a") == 1, said


def test_the_same_reason_is_given_once() -> None:
    missing = "sentence-transformers is not installed"
    assert reason_text([missing, None, missing]) == missing


def test_a_choice_error_has_no_validator_prefix() -> None:
    result = invoke("demo", "--reranker", "foo")
    assert result.exit_code == 2
    assert "Value error" not in result.output + result.stderr
    assert "'foo' is not one of 'auto'" in flat(result.output + result.stderr)


def test_a_failed_rerank_is_one_message_not_log_lines_first(wm: WireMock) -> None:
    wm.stub_json("/tei/rerank", {"error": "model crashed", "error_type": "Backend"}, status=500)
    result = invoke("rerank", "-q", "q", "--endpoint", wm.url + "/tei", stdin=CANDIDATES)
    assert result.exit_code == 1
    lines = result.stderr.splitlines()
    assert lines[0].startswith("error: rerank failed"), result.stderr
    assert "rerank.retry_scheduled" not in result.stderr
    assert "rerank.failed" not in result.stderr
    verbose = invoke(
        "rerank", "-q", "q", "--endpoint", wm.url + "/tei", "--log-level", "info",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert "rerank.retry_scheduled" in verbose.stderr
    assert "rerank.failed" in verbose.stderr


# -- 9: short help with examples; --help-all for everything ----------------------------------


@pytest.mark.parametrize("command", ["demo", "rerank", "eval"])
def test_help_fits_a_screen_with_examples_and_names_the_rest(command: str) -> None:
    short = invoke(command, "--help", COLUMNS="80")
    assert short.exit_code == 0
    lines = short.output.splitlines()
    assert len(lines) <= 60, short.output
    assert max(len(line) for line in lines) <= 100
    examples = lines[lines.index("Examples:") + 1 :]
    assert sum(1 for line in examples if line.strip().startswith(f"retrieval-stage {command}")) in (
        2,
        3,
    )
    assert "--endpoint, --provider" in short.output
    assert "--help-all describes them" in short.output
    assert "RERANK_ENDPOINT" not in short.output  # the shared options' details are not here
    full = invoke(command, "--help-all", COLUMNS="80")
    assert full.exit_code == 0
    assert "RERANK_ENDPOINT" in full.output
    for option in ("--endpoint", "--provider", "--trace-file", "--log-level", "--reranker"):
        assert f"  {option}" in full.output, option


def test_serve_help_shows_all_its_options_and_points_to_nothing_it_lacks() -> None:
    # serve takes no shared reranker/telemetry set: its --reranker, --model, --project and
    # --log-level are its own, so --help shows them instead of a --help-all it does not have.
    short = invoke("serve", "--help", COLUMNS="80")
    assert short.exit_code == 0
    for option in ("--host", "--port", "--reranker", "--model", "--project", "--log-level"):
        assert f"  {option}" in short.output, option
    assert "--help-all" not in short.output
    assert "retrieval-stage serve --reranker local" in short.output


def test_serve_helps_first_paragraph_names_every_route_it_serves() -> None:
    pytest.importorskip("starlette", reason="the [server] extra")
    from retrieval_stage.server import ServerSettings
    from retrieval_stage.server.app import create_app

    short = invoke("serve", "--help", COLUMNS="80")
    assert short.exit_code == 0
    first = " ".join(short.output.split("\n\n")[1].split())  # after "Usage: ..."
    routes = list(create_app(ServerSettings(reranker="lexical")).routes)
    assert len(routes) >= 5
    for route in routes:
        assert route.path in first, (route.path, first)
        if "POST" in (route.methods or ()):
            assert f"POST {route.path}" in first, (route.path, first)


def test_the_application_help_has_examples() -> None:
    result = invoke("--help")
    assert "Examples:" in result.output
    assert "retrieval-stage eval" in result.output


# -- 12: demo --top-k 0 as rerank; the snippet column --------------------------------------


def test_demo_top_k_zero_shows_every_candidate() -> None:
    result = invoke("demo", "--reranker", "lexical", "--top-k", "0", "--recall-k", "7")
    assert result.exit_code == 0, result.output
    rows = [line for line in result.stdout.splitlines() if "│" in line]
    assert len(rows) == 7


class _Change:
    def __init__(self, ident: str, text: str) -> None:
        from retrieval_stage.models import Candidate

        self.candidate = Candidate(ident, text, score=1.0)
        self.rank = self.recall_rank = 1
        self.movement = "="
        self.score = self.recall_score = 1.0
        self.reranked = True
        self.is_new = False
        self.moved = 0


def _rendered(width: int) -> str:
    from rich.console import Console

    console = Console(width=width, record=True, file=open("/dev/null", "w"))  # noqa: SIM115
    change = _Change("json.dumps", "json.dumps: Serialize obj to a JSON formatted str.")
    console.print(changes_table([change], score_label="score", recall_label="bm25", width=width))
    return console.export_text()


def test_the_snippet_does_not_repeat_the_id_and_goes_when_too_narrow() -> None:
    wide = _rendered(100)
    assert "│ Serialize obj to a JSON" in wide
    assert "json.dumps: Serialize" not in wide
    narrow = _rendered(60)
    assert "snippet" not in narrow
    assert "Serialize" not in narrow
    assert "json.dumps" in narrow


def test_protocol_error_from_the_client_keeps_its_own_words() -> None:
    """The library's message is unchanged: only the CLI drops its repeated prefix."""
    exc = RerankProtocolError("tei answered something that is not a tei response: x")
    assert str(exc).startswith("tei answered something")


def test_another_tools_name_for_an_option_is_answered_with_ours() -> None:
    # As a user types it: the script, so Typer's own error rendering is what is checked.
    done = run_script("rerank", "-q", "q", "--url", "http://localhost:8080")
    assert done.returncode == 2
    assert "No such option: --url (Possible options: --endpoint)" in done.stderr
    done = run_script("demo", "--token", "t")
    assert "No such option: --token (Possible options: --api-key)" in done.stderr


def test_a_provider_from_the_environment_is_named_by_its_variable() -> None:
    result = invoke(
        "rerank", "-q", "q", "--endpoint", "http://localhost:8080",
        stdin=CANDIDATES, RERANK_PROVIDER="tie",
    )  # fmt: skip
    assert result.exit_code == 2
    said = flat(result.stderr)
    assert said.startswith("error: RERANK_PROVIDER: 'tie' is not one of: tei, ")
    assert said.endswith("(did you mean 'tei'?)")
    typed = invoke(
        "rerank", "-q", "q", "--endpoint", "http://localhost:8080", "--provider", "tie",
        stdin=CANDIDATES,
    )  # fmt: skip
    assert flat(typed.stderr).startswith("error: --provider: 'tie' is not one of: ")


def test_a_client_given_a_misspelt_provider_names_the_field_and_the_closest() -> None:
    with pytest.raises(InvalidSetting) as refused:
        RerankClient("http://localhost:8080", provider="cohre")
    assert refused.value.field == "provider"
    assert str(refused.value).startswith(
        "unknown rerank provider 'cohre' (did you mean 'cohere'?); known: cohere, "
    )
