"""A script that configured no logging still hears the library's warnings, one line each.

Python's convention: a library logs through `logging` and installs no handler of its own; when
the application configured nothing, a WARNING reaches stderr through `logging.lastResort`. Here
a plain script (its own process, no logging set-up) reranks against a server that fails and
reads the configuration with a mistyped provider: stderr says each once, in words, and nothing
else; stdout carries only what the script printed. A retry is not a warning (INFO, like the
openai SDK's retry lines): the fallback that follows says what the caller must know.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from ..conftest import WireMock

API_KEY = "sk-plain-script-0123456789"

SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from retrieval_stage import Candidate, RerankClient, RerankStage
    from retrieval_stage.config import make_reranker

    url = sys.argv[1]
    candidates = [Candidate("a", "alpha text", score=1.0), Candidate("b", "beta text", score=2.0)]
    with RerankClient(url, api_key=os.environ["KEY"], timeout=10.0) as client:
        results = RerankStage(client).run("what is alpha", candidates)
    os.environ["RERANK_ENDPOINT"] = url
    os.environ["RERANK_PROVIDER"] = "tie"  # the typo
    chosen = make_reranker()
    print(json.dumps({"ids": [r.candidate.id for r in results],
                      "reranked": [r.reranked for r in results],
                      "chosen": type(chosen).__name__}))
    """
)


def _run(script: str, *args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "plain.py"
    path.write_text(script, encoding="utf-8")
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RERANK_", "OTEL_", "RETRIEVAL_STAGE_"))
    }
    env["KEY"] = API_KEY
    return subprocess.run(
        [sys.executable, str(path), *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
        check=False,
    )


def test_a_plain_script_reads_one_line_per_warning_on_stderr(wm: WireMock, tmp_path: Path) -> None:
    wm.stub_json("/tei/rerank", {"error": "model crashed", "error_type": "Backend"}, status=500)
    done = _run(SCRIPT, f"{wm.url}/tei", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    printed = json.loads(done.stdout)
    assert printed == {"ids": ["b", "a"], "reranked": [False, False], "chosen": "NullReranker"}
    lines = done.stderr.splitlines()
    assert len(lines) == 2, done.stderr
    fallback, config = lines
    assert fallback.startswith("rerank.fallback: ")
    assert "the candidates were returned in recall order" in fallback
    assert "HTTP 500: model crashed" in fallback
    assert config.startswith("rerank.config_invalid: ")
    assert "RERANK_PROVIDER: 'tie' is not one of: tei, cohere" in config  # the choices named
    assert "using NullReranker (no reranking)" in config
    assert len(wm.requests("/tei/rerank")) == 3  # retried twice, silently
    assert API_KEY not in done.stderr + done.stdout


def test_an_application_that_configured_logging_gets_them_through_its_handler(
    wm: WireMock, tmp_path: Path
) -> None:
    wm.stub_json("/tei/rerank", {"error": "model crashed", "error_type": "Backend"}, status=500)
    script = "import logging, sys\n" + (
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO, "
        "format='APP %(levelname)s %(name)s %(message)s')\n"
    )
    done = _run(script + SCRIPT, f"{wm.url}/tei", tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""  # the application's handler, not lastResort
    ours = [
        line
        for line in done.stdout.splitlines()
        if line.startswith("APP ") and line.split()[2].startswith("retrieval_stage")
    ]
    assert [line.split()[1:3] for line in ours] == [
        ["INFO", "retrieval_stage.client"],
        ["INFO", "retrieval_stage.client"],
        ["WARNING", "retrieval_stage.stage"],
        ["WARNING", "retrieval_stage.config"],
    ]
    assert "rerank.retry_scheduled" in ours[0]


def test_the_library_installs_no_handler() -> None:
    """A NullHandler would count as configured and keep lastResort silent."""
    import retrieval_stage
    import retrieval_stage.config
    import retrieval_stage.telemetry  # noqa: F401

    for name in ("retrieval_stage", "retrieval_stage.stage", "retrieval_stage.config"):
        assert logging.getLogger(name).handlers == [], name


def test_a_provider_shut_down_by_hand_says_once_what_it_lost_and_not_again_at_exit(
    tmp_path: Path,
) -> None:
    """``provider.shutdown()`` is `shutdown_telemetry` for that provider: the loss is said
    then, once, and the exit hook has nothing left to report (it used to report it again)."""
    script = textwrap.dedent(
        """
        import socket, sys
        from retrieval_stage.telemetry import configure_tracing, otlp_span_exporter

        with socket.socket() as s:  # a port nothing listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        provider = configure_tracing(
            "plain", exporter=otlp_span_exporter(f"http://127.0.0.1:{port}", timeout=0.5),
            shutdown_timeout=1.0,
        )
        for _ in range(3):
            with provider.get_tracer("plain").start_as_current_span("lost"):
                pass
        provider.shutdown()
        sys.stderr.write("MARK after shutdown\\n")
        """
    )
    done = _run(script, tmp_path=tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines[-1] == "MARK after shutdown", done.stderr
    lost = [line for line in lines if line.startswith("telemetry.undelivered")]
    assert len(lost) == 1, done.stderr
    assert "3 spans" in lost[0]
