"""Print the shape of the `retrieval_stage` package: its import graph by room, and its crossings.

A *room* is a top-level module of the package (``stage``, ``__init__``) or one of its sub-package
folders (``client``, ``spans``). Every ``import`` of our own modules counts, at any depth:
module level, inside functions, inside ``if TYPE_CHECKING:`` blocks (the output says how many of
each). An *arrow* is a distinct room -> room edge (importer -> imported). *Floors* are layers
by longest path: floor 0 imports no other room, and a room stands one floor above the highest
room it imports. Cycles are found as strongly connected components larger than one, at module
level and at room level; to lay out floors, each room cycle is opened by dropping its lightest
arrows (fewest import statements) until none is left, and those dropped arrows are the
*upward arrows*: they point from a room to a room on a higher floor.

``--trace`` also runs one warm traced ``RerankStage.run`` (50 candidates, a recording span
through a real ``TracerProvider`` with a ``BatchSpanProcessor`` and an exporter that drops
everything, the package's own `LexicalReranker` as the tiny in-process reranker, after one
warm-up call) under ``sys.setprofile``. Each ``call`` event whose code lives in another file
than the last one counted is a *file change*; when that file also stands in another folder it
is a *folder crossing*. Only our package's files and the installed dependencies' files
(anything under a ``site-packages`` folder) are counted; the standard library and this script
are passed over. A dependency's folder is its first two path parts under ``site-packages``
(``opentelemetry/sdk``, ``openinference/instrumentation``), so a switch into a dependency
leaves our package.

Usage: python scripts/architecture.py [--trace] [--package-dir DIR]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PACKAGE = "retrieval_stage"
DEPENDENCY = "<dependency>"  # a file straight under site-packages


@dataclass
class ImportCounts:
    """How many import statements of our own modules were read, by where they stand."""

    module_level: int = 0
    in_function: int = 0
    type_checking: int = 0


@dataclass
class Graph:
    """Modules, their imports of each other, and the same graph collapsed to rooms."""

    modules: dict[str, Path]
    module_edges: dict[str, set[str]]
    room_weights: dict[tuple[str, str], int] = field(default_factory=dict)
    counts: ImportCounts = field(default_factory=ImportCounts)


def module_name(path: Path, root: Path) -> str:
    """``retrieval_stage/client/sync.py`` -> ``retrieval_stage.client.sync``."""
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def room_of(module: str) -> str:
    """The room a module stands in: its sub-package folder, or itself at the top level.

    A ``__main__`` module is an entry point that nothing imports (``python -m ...`` runs it), so
    it is a room of its own (``server/__main__``) and may stand above the wings it starts.
    """
    parts = module.split(".")
    if len(parts) == 1:
        return "__init__"
    if parts[-1] == "__main__" and len(parts) > 2:
        return f"{parts[1]}/__main__"
    return parts[1]


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(tree: ast.Module) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
    """Every import node with where it stands: module level, function, or TYPE_CHECKING."""

    def walk(node: ast.AST, where: str) -> Iterable[tuple[ast.Import | ast.ImportFrom, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, where
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                yield from walk(child, "function" if where == "module" else where)
            elif isinstance(child, ast.If) and _is_type_checking(child.test):
                for stmt in child.body:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), "type_checking")
                for stmt in child.orelse:
                    yield from walk(ast.Module(body=[stmt], type_ignores=[]), where)
            else:
                yield from walk(child, where)

    return walk(tree, "module")


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_pkg: bool) -> list[str]:
    """The absolute names a node imports (a ``from X import y`` names ``X.y`` and ``X``)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if node.level:
        base = module.split(".") if is_pkg else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        prefix = ".".join(base + ([node.module] if node.module else []))
    else:
        prefix = node.module or ""
    return [prefix] + [f"{prefix}.{alias.name}" for alias in node.names]


def build(root: Path) -> Graph:
    """Read every module under `root` and collect its imports of the package's own modules."""
    modules = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    graph = Graph(modules=modules, module_edges=defaultdict(set))
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_pkg = path.name == "__init__.py"
        for node, where in _imports(tree):
            found = set()
            for target in _targets(node, name, is_pkg):
                if target in modules and target != name:
                    found.add(target)
            # `from pkg import name`: keep the submodule when `name` is one, else the package.
            subs = {t for t in found if any(t.startswith(o + ".") for o in found)}
            found = subs or found
            if not found:
                continue
            slot = {"module": "module_level", "function": "in_function"}.get(where, where)
            setattr(graph.counts, slot, getattr(graph.counts, slot) + 1)
            for target in found:
                graph.module_edges[name].add(target)
                a, b = room_of(name), room_of(target)
                if a != b:
                    graph.room_weights[(a, b)] = graph.room_weights.get((a, b), 0) + 1
    return graph


def sccs(nodes: Sequence[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components, iteratively."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    result: list[list[str]] = []
    counter = 0
    for start in nodes:
        if start in index:
            continue
        work: list[tuple[str, Iterable[str]]] = [(start, iter(sorted(edges.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                result.append(sorted(component))
    return result


def cycles(nodes: Sequence[str], edges: dict[str, set[str]]) -> list[list[str]]:
    return [c for c in sccs(nodes, edges) if len(c) > 1]


def floors(
    rooms: Sequence[str], weights: dict[tuple[str, str], int]
) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Each room's floor, and the upward arrows dropped to open the room cycles."""
    edges: dict[str, set[str]] = defaultdict(set)
    for a, b in weights:
        edges[a].add(b)
    dropped: list[tuple[str, str]] = []
    while found := cycles(rooms, edges):
        members = set(found[0])
        inside = [(w, a, b) for (a, b), w in weights.items() if a in members and b in members]
        inside = [(w, a, b) for w, a, b in inside if b in edges[a]]
        _, a, b = min(inside)
        edges[a].discard(b)
        dropped.append((a, b))
    floor: dict[str, int] = {}

    def height(room: str) -> int:
        if room not in floor:
            floor[room] = 1 + max((height(t) for t in edges[room]), default=-1)
        return floor[room]

    for room in rooms:
        height(room)
    return floor, [(a, b) for a, b in dropped if floor[b] > floor[a]]


def report_graph(root: Path) -> None:
    graph = build(root)
    modules = sorted(graph.modules)
    rooms = sorted({room_of(m) for m in modules})
    lines = {m: len(p.read_text(encoding="utf-8").splitlines()) for m, p in graph.modules.items()}
    largest = max(lines, key=lambda m: lines[m])
    module_cycles = cycles(modules, graph.module_edges)
    room_edges: dict[str, set[str]] = defaultdict(set)
    for a, b in graph.room_weights:
        room_edges[a].add(b)
    room_cycles = cycles(rooms, room_edges)
    floor, upward = floors(rooms, graph.room_weights)
    c = graph.counts
    print(f"modules: {len(modules)}")
    where = graph.modules[largest].relative_to(root.parent)
    print(f"largest module: {where} ({lines[largest]} lines)")
    print(
        f"imports of our own modules counted: {c.module_level + c.in_function + c.type_checking} "
        f"({c.module_level} at module level, {c.in_function} inside functions, "
        f"{c.type_checking} under TYPE_CHECKING)"
    )
    print(f"rooms: {len(rooms)}")
    print(f"floors: {max(floor.values()) + 1}")
    print(f"arrows: {len(graph.room_weights)}")
    print(f"cycles (modules): {len(module_cycles)}")
    for cyc in module_cycles:
        print(f"  {' <-> '.join(cyc)}")
    print(f"cycles (rooms): {len(room_cycles)}")
    for cyc in room_cycles:
        print(f"  {' <-> '.join(cyc)}")
    print(f"upward arrows: {len(upward)}")
    for a, b in upward:
        print(f"  {a} (floor {floor[a]}) -> {b} (floor {floor[b]})")
    for level in range(max(floor.values()), -1, -1):
        print(f"  floor {level}: {' '.join(r for r in rooms if floor[r] == level)}")


class _Drop:
    """A span exporter that drops everything: the trace is real, nothing leaves the process."""

    def export(self, spans: Sequence[Any]) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True


def report_trace(root: Path) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    from retrieval_stage import Candidate, RerankStage
    from retrieval_stage.local.lexical import LexicalReranker

    provider = TracerProvider()
    provider.add_span_processor(BatchSpanProcessor(_Drop()))  # type: ignore[arg-type]
    stage = RerankStage(LexicalReranker(), tracer_provider=provider)
    candidates = [Candidate(id=f"d{i}", text=f"document {i} " * (i % 7 + 1)) for i in range(50)]
    stage.run("warm-up", candidates)

    ours = str(root.resolve()) + "/"
    folder_of: dict[str, str | None] = {}

    def place(filename: str) -> str | None:
        if filename not in folder_of:
            if filename.startswith(ours):
                inner = Path(filename[len(ours) :]).parent
                folder_of[filename] = "/".join((PACKAGE, *inner.parts))
            elif "site-packages/" in filename:
                inside = filename.split("site-packages/", 1)[1].split("/")[:-1]
                folder_of[filename] = "/".join(inside[:2]) or DEPENDENCY
            else:
                folder_of[filename] = None
        return folder_of[filename]

    state: dict[str, Any] = {"file": None, "folder": None, "files": 0, "crossings": 0}
    folders: set[str] = set()

    def enter(filename: str) -> None:
        folder = place(filename)
        if folder is None or filename == state["file"]:
            return
        if state["file"] is not None:
            state["files"] += 1
            if folder != state["folder"]:
                state["crossings"] += 1
        state["file"], state["folder"] = filename, folder
        folders.add(folder)

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "call":
            enter(frame.f_code.co_filename)

    sys.setprofile(profile)
    try:
        stage.run("how do I sort a list", candidates)
    finally:
        sys.setprofile(None)
    provider.shutdown()
    print("trace of one warm RerankStage.run (50 candidates, recording span):")
    print(f"  file changes: {state['files']}")
    print(f"  folder crossings: {state['crossings']} among {len(folders)} folders")
    for folder in sorted(folders):
        print(f"    {folder}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--trace", action="store_true", help="also trace one RerankStage.run")
    parser.add_argument("--package-dir", type=Path, default=None, help="the package folder")
    args = parser.parse_args(argv)
    root = args.package_dir or Path(__file__).resolve().parent.parent / PACKAGE
    report_graph(root)
    if args.trace:
        sys.path.insert(0, str(root.parent))
        report_trace(root)
    return 0


if __name__ == "__main__":
    sys.exit(main())
