"""The report: the run's results as the Markdown tables ``python -m benchmarks`` prints.

A row is ``(measure, result, target, verdict)``. Each section builds its own rows (its
``targets`` and ``rows`` functions, in `benchmarks.sections`); this module only formats
figures (`ratio`, `verdict`), puts the targets first and every other row after them, in
registry order, and adds the machine and load lines.
"""

from __future__ import annotations

from typing import Any

from .sections import NAMES, load

Row = tuple[str, str, str, str]


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def ratio(x: dict[str, float], digits: int = 2, suffix: str = "x") -> str:
    """A per-round ratio as 'median (rounds min-max)'."""
    return f"{x['median']:.{digits}f}{suffix} (rounds {x['min']:.{digits}f}-{x['max']:.{digits}f})"


def markdown(rows: list[Row]) -> str:
    lines = ["| measure | result | target | |", "|---|---|---|---|"]
    lines += [f"| {a} | {b} | {c} | {d} |" for a, b, c, d in rows]
    return "\n".join(lines)


def table(results: dict[str, Any]) -> str:
    """The issue's targets first, then every other figure, as Markdown tables.

    A section's ``targets(result, results)`` rows go in the first table and its
    ``rows(result, results)`` in the second, both in registry order (the targets of issue 15
    are registered in the order the issue lists them).
    """
    targets: list[Row] = []
    rows: list[Row] = []
    for name in NAMES:
        section = load(name)
        result = results.get(name)
        if result and hasattr(section, "targets"):
            targets += section.targets(result, results)
        if name in results and hasattr(section, "rows"):
            rows += section.rows(result, results)
    loads = ", ".join(
        f"{name} {average:.2f}" for name, average in results.get("section_load", {}).items()
    )
    return (
        "Targets (issues 15, 26 and 28), ratios per interleaved round: median (range)\n\n"
        + markdown(targets)
        + f"\n\nEverything else\n\n{markdown(rows)}\n\n"
        + f"1-minute load average at each section's start: {loads}"
    )


def text(results: dict[str, Any]) -> str:
    """Everything ``python -m benchmarks`` prints on stdout: machine, timing, load, tables."""
    m = results["machine"]
    before = " ".join(f"{x:.2f}" for x in results["load_average_before"])
    after = " ".join(f"{x:.2f}" for x in results["load_average_after"])
    return "\n".join(
        [
            f"\nmachine: {m['cpus']} CPUs, {m['cpu_model']}, Python {m['python']}",
            f"wall time: {results['wall_seconds']:.0f}s; load average before {before}, "
            f"after {after}",
            "(a busy machine skews ratios: rerun when the load average before is well under 1)\n",
            table(results),
        ]
    )
