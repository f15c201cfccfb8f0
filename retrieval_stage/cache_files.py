"""The files the package computes once and keeps: where they go, how they are written, and the
content digest that keys them.

Dense recall's document embeddings (`retrieval_stage.recall.dense`) and the embedding model's
int8 and bf16 graphs (`retrieval_stage.local.graph_cache`) live under `default_cache_dir`, are
written whole or not at all (`write_atomically`), and are keyed by the model weights' content
(`file_digest`, remembered so a run hashes 91 MB only when the file changed). One module below
both, so neither imports the other and the two caches cannot drift apart.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
from pathlib import Path

__all__ = ["default_cache_dir", "file_digest", "write_atomically"]

_DIGEST = re.compile(r"[0-9a-f]{64}")


def default_cache_dir() -> Path:
    """The user's cache directory for this package: ``$XDG_CACHE_HOME/retrieval-stage``.

    ``~/.cache/retrieval-stage`` when ``XDG_CACHE_HOME`` is unset, ``%LOCALAPPDATA%`` on
    Windows.
    """
    base = os.environ.get("XDG_CACHE_HOME", "").strip()
    if not base and os.name == "nt":
        base = os.environ.get("LOCALAPPDATA", "").strip()
    root = Path(base) if base else Path.home() / ".cache"
    return root / "retrieval-stage"


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flushed to disk, then rename it over
    `path`: a reader sees the old file or the whole new one. OSError when it cannot."""
    temporary: str | None = None
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=".", suffix=".tmp")
        with os.fdopen(handle, "wb") as out:
            out.write(data)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
        temporary = None
    finally:
        if temporary is not None:
            Path(temporary).unlink(missing_ok=True)


def file_digest(path: Path, memo_dir: Path | None, *, min_bytes: int = 0) -> str:
    """The SHA-256 of `path`'s content; for a file of at least `min_bytes`, remembered under
    `memo_dir` (None: never), keyed by what changes when the file does (its real path, device,
    inode, size, mtime and ctime: a rewrite in place changes ctime even when mtime is put
    back). A memo that cannot be read or written costs a re-hash, never a wrong digest."""
    stat = path.stat()
    memo: Path | None = None
    if memo_dir is not None and stat.st_size >= min_bytes:
        key = (
            f"{os.path.realpath(path)}\x00{stat.st_dev}\x00{stat.st_ino}\x00{stat.st_size}"
            f"\x00{stat.st_mtime_ns}\x00{stat.st_ctime_ns}"
        )
        memo = memo_dir / hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        try:
            known = memo.read_text(encoding="ascii").strip()
        except (OSError, UnicodeDecodeError):
            known = ""
        if _DIGEST.fullmatch(known):
            return known
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while block := handle.read(1 << 20):
            digest.update(block)
    found = digest.hexdigest()
    if memo is not None:
        with contextlib.suppress(OSError):  # a cache: a failure costs a re-hash next time
            write_atomically(memo, found.encode("ascii"))
    return found
