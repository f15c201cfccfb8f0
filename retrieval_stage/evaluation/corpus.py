"""The bundled corpus: real text from the Python standard library's docstrings.

The demo and the example eval set need documents a person can read and judge, present on every
machine with no download. The docstrings of a fixed list of standard-library modules are exactly
that. `build_corpus()` extracts them from the running interpreter, deterministically (modules and
members sorted); the package ships the output for one Python version as
``data/stdlib_docs.jsonl``, so the example qrels always name documents that exist and the demo
shows the same text on every Python. ``python -m retrieval_stage.evaluation.corpus``
regenerates the file.

The docstrings are Python's own, under the PSF License (see ``data/NOTICE``).
"""

from __future__ import annotations

import importlib
import inspect
import json
import re
import sys
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any

from ..jsonl import JsonLineError, candidate_fields, json_lines
from ..models import Candidate

__all__ = [
    "CORPUS_FILE",
    "EXAMPLE_CANDIDATES",
    "EXAMPLE_DEPTH",
    "EXAMPLE_QRELS",
    "EXAMPLE_QUERIES",
    "STDLIB_MODULES",
    "build_corpus",
    "data_path",
    "load_corpus",
    "write_example_run",
    "write_jsonl",
]

STDLIB_MODULES: tuple[str, ...] = (
    "argparse", "base64", "bisect", "calendar", "collections", "contextlib", "copy", "csv",
    "datetime", "difflib", "enum", "fnmatch", "fractions", "functools", "glob", "gzip",
    "hashlib", "heapq", "hmac", "html", "io", "itertools", "json", "logging", "math",
    "operator", "os", "pathlib", "pickle", "pprint", "queue", "random", "re", "secrets",
    "shlex", "shutil", "sqlite3", "statistics", "string", "struct", "subprocess", "tarfile",
    "tempfile", "textwrap", "threading", "time", "timeit", "unicodedata", "urllib.parse",
    "uuid", "zipfile", "zlib",
)  # fmt: skip
"""The modules the corpus is built from: common, documented, present in every CPython build."""

CORPUS_FILE = "stdlib_docs.jsonl"
EXAMPLE_QUERIES = "example/queries.tsv"
EXAMPLE_QRELS = "example/qrels.txt"
EXAMPLE_CANDIDATES = "example/candidates.run"
EXAMPLE_DEPTH = 50
"""Candidates per query in the example run: what the demo recalls too."""

MAX_CHARS = 700
"""Longest document text kept: whole paragraphs up to this many characters (a cross-encoder
reads about 512 tokens; the first paragraphs say what a thing is for)."""


def data_path(name: str) -> Path:
    """The path of a file shipped in ``retrieval_stage/data``."""
    path = resources.files("retrieval_stage").joinpath("data", *name.split("/"))
    return Path(str(path))


def load_corpus(path: str | Path | None = None) -> list[Candidate]:
    """The documents of a corpus JSON-lines file (default: the bundled one), in file order.

    Each line is ``{"id", "text", "metadata"?}``; the returned candidates carry no score.
    """
    source = Path(path) if path is not None else data_path(CORPUS_FILE)
    documents: list[Candidate] = []
    with source.open(encoding="utf-8") as handle:
        for number, record in json_lines(handle):
            try:
                ident, text, _, metadata = candidate_fields(record)
            except ValueError as exc:
                raise JsonLineError(number, str(exc)) from None
            assert text is not None  # required
            documents.append(Candidate(ident, text, metadata=metadata))
    return documents


def build_corpus(modules: Sequence[str] = STDLIB_MODULES) -> list[Candidate]:
    """Documents from the docstrings of `modules` in the running interpreter.

    One document per documented public function, class, and public method or property of those
    classes, ordered by module then name. The id is the dotted name (``json.dumps``,
    ``collections.OrderedDict.move_to_end``); the text is that name followed by the docstring's
    leading paragraphs.
    """
    documents: list[Candidate] = []
    seen: set[str] = set()
    for module_name in sorted(modules):
        module = importlib.import_module(module_name)
        for qualname, kind, doc in _members(module_name, module):
            if qualname in seen:
                continue
            seen.add(qualname)
            text = f"{qualname}: {_leading_paragraphs(doc)}"
            documents.append(
                Candidate(qualname, text, metadata={"module": module_name, "kind": kind})
            )
    return documents


def _members(module_name: str, module: Any) -> Iterator[tuple[str, str, str]]:
    exported = getattr(module, "__all__", None)
    names = sorted(exported) if exported is not None else sorted(vars(module))
    home = {module_name, "_" + module_name.rsplit(".", 1)[-1]}
    for name in names:
        if name.startswith("_"):
            continue
        obj = getattr(module, name, None)
        if not (inspect.isclass(obj) or inspect.isroutine(obj)):
            continue
        if exported is None and getattr(obj, "__module__", None) not in home:
            continue  # imported from elsewhere, not this module's own
        doc = inspect.getdoc(obj)
        if not doc:
            continue
        qualname = f"{module_name}.{name}"
        yield qualname, "class" if inspect.isclass(obj) else "function", doc
        if inspect.isclass(obj):
            yield from _methods(qualname, obj)


def _methods(qualname: str, cls: type) -> Iterator[tuple[str, str, str]]:
    for name, member in sorted(vars(cls).items()):
        if name.startswith("_"):
            continue
        if isinstance(member, property):
            kind = "property"
        elif inspect.isroutine(member) or isinstance(member, (classmethod, staticmethod)):
            kind = "method"
        else:
            continue
        doc = inspect.getdoc(member)
        if doc:
            yield f"{qualname}.{name}", kind, doc


_STRUCTURED_LINE = re.compile(
    r"\s"  # indented: a literal block, a doctest or a definition's body
    r"|[+][-=+]+[+]\s*$"  # a grid table's border
    r"|[|].*[|]\s*$"  # a grid table's row
    r"|=+( +=+)+\s*$"  # a simple table's border
    r"|>>> "  # a doctest
)


def _is_structured(paragraph: str) -> bool:
    """Whether `paragraph`'s line breaks carry meaning: a reST table, literal block or doctest."""
    return any(_STRUCTURED_LINE.match(line) for line in paragraph.splitlines())


def _kept_lines(paragraph: str) -> str:
    """A structured paragraph as written: its lines, trailing spaces and outer blank lines
    dropped."""
    return "\n".join(line.rstrip() for line in paragraph.strip("\n").splitlines())


def _leading_paragraphs(doc: str, max_chars: int = MAX_CHARS) -> str:
    """Whole paragraphs up to `max_chars`; the first is always kept.

    Prose has its whitespace collapsed; reST tables, literal blocks and doctests keep their
    lines, so a card that shows them stays readable. `max_chars` counts the words and their
    single separators, not the layout's spaces, so keeping a table's lines never changes which
    paragraphs are kept (nor, therefore, the words recall indexes).
    """
    paragraphs = [p for p in re.split(r"\n\s*\n", doc) if p.strip()]
    kept: list[str] = []
    flat_kept: list[str] = []
    used = 0
    for paragraph in paragraphs:
        flat = " ".join(paragraph.split())
        if kept and used + len(flat) + 1 > max_chars:
            break
        kept.append(_kept_lines(paragraph) if _is_structured(paragraph) else flat)
        flat_kept.append(flat)
        used += len(flat) + 1
    text = "\n".join(flat_kept)
    if len(text) > max_chars:  # one paragraph past the budget: cut, as prose
        return text[: max_chars - 1].rstrip() + "…"
    return "\n".join(kept)


def write_jsonl(documents: Iterable[Candidate], path: str | Path) -> int:
    """Write documents as corpus JSON lines (``id``, ``text``, ``metadata``); returns the count."""
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for document in documents:
            record = {"id": document.id, "text": document.text, "metadata": dict(document.metadata)}
            handle.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
            count += 1
    return count


def write_example_run(
    documents: Sequence[Candidate], queries: Iterable[tuple[str, str]], path: str | Path
) -> int:
    """Write BM25's top `EXAMPLE_DEPTH` for each query as a TREC run; returns the line count.

    The example eval set's candidates: what recall found, for the reranker to reorder.
    """
    from ..recall import BM25Recall

    recall = BM25Recall(documents)
    count = 0
    with Path(path).open("w", encoding="utf-8") as handle:
        for qid, text in queries:
            for rank, candidate in enumerate(recall.recall(text, EXAMPLE_DEPTH), start=1):
                handle.write(f"{qid} Q0 {candidate.id} {rank} {candidate.score:.6f} bm25\n")
                count += 1
    return count


def _main(argv: Sequence[str]) -> int:
    """Regenerate the shipped data from this Python (maintainers only).

    ``python -m retrieval_stage.evaluation.corpus`` rewrites the corpus file; ``--example``
    rewrites the example run from the shipped corpus and queries (queries and qrels are
    written by hand).
    """
    if argv[:1] == ["--example"]:
        queries = []
        for line in data_path(EXAMPLE_QUERIES).read_text(encoding="utf-8").splitlines():
            qid, _, text = line.partition("\t")
            queries.append((qid, text))
        out = data_path(EXAMPLE_CANDIDATES)
        count = write_example_run(load_corpus(), queries, out)
        print(f"wrote {count} run lines for {len(queries)} queries to {out}")
        return 0
    out = Path(argv[0]) if argv else data_path(CORPUS_FILE)
    count = write_jsonl(build_corpus(), out)
    print(f"wrote {count} documents from Python {sys.version.split()[0]} to {out}")
    return 0


if __name__ == "__main__":  # pragma: no cover - a maintenance command
    raise SystemExit(_main(sys.argv[1:]))
