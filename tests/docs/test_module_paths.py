"""Every module path the README, docs/ and the code's own text name exists.

A path is a dotted name under the package (a module, or an attribute of one, such as the
settings class in its config module), ``python -m`` with such a module (it must be able to
run), or a file path under retrieval_stage/ or tests/ ending in ``.py``. Read from README.md,
docs/**/*.md and the whole text of every Python file in retrieval_stage/, tests/, benchmarks/
and scripts/ (docstrings, comments, messages). Dotted names that are span, metric or
log-event names are told apart by being written in the code as one whole string literal:
those are names a dashboard queries (or a test spells wrong on purpose), not paths. The
failure lists every missing path.
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "retrieval_stage"

_NAME = r"retrieval_stage(?:\.[A-Za-z_][A-Za-z0-9_]*)+"
_REFERENCE = re.compile(
    rf"(?P<run>python -m )?(?P<dotted>{_NAME})|(?P<file>(?:retrieval_stage|tests)/[\w/]+\.py)\b"
)


_CODE = ("retrieval_stage", "tests", "benchmarks", "scripts")


def _sources() -> list[Path]:
    docs = sorted((ROOT / "docs").rglob("*.md"))
    code = [p for folder in _CODE for p in sorted((ROOT / folder).rglob("*.py"))]
    return [ROOT / "README.md", *docs, *code]


def _telemetry_names() -> set[str]:
    """Every string literal in the code that is one whole dotted name under the package."""
    names: set[str] = set()
    for path in (p for p in _sources() if p.suffix == ".py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            value = node.value if isinstance(node, ast.Constant) else None
            if isinstance(value, str) and re.fullmatch(_NAME, value):
                names.add(value)
    return names


def _module_names(path: Path) -> set[str] | None:
    """The names a module defines at its top level, read from its source (no import)."""
    try:
        tree = ast.parse(path.read_text(encoding="utf-8"))
    except OSError:
        return None
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


def _find_module(name: str) -> importlib.machinery.ModuleSpec | None:
    try:
        return importlib.util.find_spec(name)
    except (ModuleNotFoundError, ValueError):
        return None


def _has_attribute(module: str, spec: importlib.machinery.ModuleSpec, chain: list[str]) -> bool:
    """Whether `module` has the attribute `chain[0]` (and it `chain[1]`, ...): by import, or,
    when the module needs an extra that is missing here, by its top-level names."""
    try:
        value: object = importlib.import_module(module)
    except ImportError:
        names = _module_names(Path(spec.origin)) if spec.origin else None
        return names is not None and chain[0] in names
    for part in chain:
        if not hasattr(value, part):
            return False
        value = getattr(value, part)
    return True


def _exists(dotted: str, run: bool) -> bool:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        module = ".".join(parts[:cut])
        spec = _find_module(module)
        if spec is None:
            continue
        if cut == len(parts):
            return (
                not run
                or spec.submodule_search_locations is None
                or bool(_find_module(f"{module}.__main__"))
            )
        return not run and _has_attribute(module, spec, parts[cut:])
    return False


def references() -> Iterator[tuple[str, str]]:
    """(where, path) for every path named in the documents and the package."""
    for source in _sources():
        text = source.read_text(encoding="utf-8")
        for match in _REFERENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            yield f"{source.relative_to(ROOT)}:{line}", match.group(0)


def missing() -> list[str]:
    telemetry = _telemetry_names()
    found: list[str] = []
    for where, reference in references():
        if reference.endswith(".py"):
            ok = (ROOT / reference).is_file()
        else:
            run = reference.startswith("python -m ")
            dotted = reference.removeprefix("python -m ")
            ok = (not run and dotted in telemetry) or _exists(dotted, run)
        if not ok:
            found.append(f"{where}: {reference}")
    return found


def test_the_documents_name_module_paths() -> None:
    """A pattern that matches nothing would pass every document."""
    kinds = {("file" if r.endswith(".py") else "dotted") for _, r in references()}
    assert kinds == {"file", "dotted"}
    assert sum(1 for _ in references()) > 100


def test_every_module_path_named_exists() -> None:
    gone = missing()
    assert not gone, f"{len(gone)} paths name nothing that exists:\n" + "\n".join(gone)
