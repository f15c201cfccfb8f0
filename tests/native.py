"""Running a test with the C loops (`retrieval_stage._speedups`) and with the Python they
stand in for: each module that uses them keeps them as its ``_c``."""

from __future__ import annotations

from types import ModuleType

import pytest

LOOPS = ["c", "python"]
"""A fixture's params: the C loops, then the Python."""


def use_loops(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch, module: ModuleType
) -> str:
    """Leave `module`'s C loops in place (``"c"``, skipping where they were not built) or take
    them away for the test (``"python"``); returns which."""
    if request.param == "python":
        monkeypatch.setattr(module, "_c", None)
    elif getattr(module, "_c", None) is None:
        pytest.skip("the C loops are not built here: see test_the_c_loops_are_built")
    return str(request.param)
