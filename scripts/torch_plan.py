"""Say what installing torch would download, before anything is downloaded.

``make`` runs ``pip install --dry-run --report`` for the pinned torch (pip reads only package
metadata for that) and pipes the report here. On public PyPI the Linux x86_64 ``torch`` is a
CUDA build whose ``nvidia-*`` dependencies come to several GB; PyTorch's own CPU index has the
~190 MB CPU build. Exit status: 0 a CPU build (install it), 3 a CUDA build (``make`` then goes
on without it unless told to take it), 2 the report could not be read.

Usage: pip install --dry-run --ignore-installed --quiet --report - TORCH | python torch_plan.py
"""

from __future__ import annotations

import json
import sys

CPU_INDEX = "https://download.pytorch.org/whl/cpu"
CUDA = 3


def plan(report: dict[str, object]) -> tuple[int, str]:
    """(exit status, one line) for a pip installation report."""
    items = report.get("install")
    if not isinstance(items, list):
        return 2, "pip's report lists nothing to install"
    names = [str(item.get("metadata", {}).get("name", "")).lower() for item in items]
    versions = {
        str(item["metadata"]["name"]).lower(): str(item["metadata"].get("version", ""))
        for item in items
        if isinstance(item, dict) and "metadata" in item
    }
    cuda = sorted(n for n in names if n.startswith(("nvidia-", "triton")))
    torch = versions.get("torch", "?")
    if cuda:
        return CUDA, (
            f"torch {torch} from this index is a CUDA build: with {len(cuda)} packages of "
            f"NVIDIA libraries ({', '.join(cuda[:3])}, ...) it is several GB to download"
        )
    return 0, f"torch {torch}: a CPU build, about 190 MB"


def main() -> int:
    try:
        report = json.load(sys.stdin)
    except ValueError:  # pip found nothing to install (make says so)
        return 2
    status, line = plan(report)
    print(line)
    return status


if __name__ == "__main__":
    raise SystemExit(main())
