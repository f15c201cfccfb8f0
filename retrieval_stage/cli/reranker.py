"""Which reranker a command runs: `RerankSettings` built from the options and config's factory.

With an endpoint (or ``--provider local``) the reranker is whatever `make_reranker` makes of
the settings, as for a library user reading ``RERANK_*``; a refused value exits 2 naming its
option. Without an endpoint, ``--reranker`` picks the in-process cross-encoder, the embedding
reranker (the packaged all-MiniLM-L6-v2 by default) or the lexical fallback, loaded now with a
spinner. ``auto`` takes, in order: the endpoint when given, a cross-encoder that loads (offline:
only one already on disk), the embedding model, lexical — and says why it passed the others.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .._redact import scrubbed_message, shown_url
from ..client import RerankClient
from ..config import (
    FALLBACKS,
    LOCAL,
    ChainSettings,
    RerankSettings,
    chain_values,
    make_chain,
    make_reranker,
    parse_fallbacks,
)
from ..errors import RerankError
from ..failover import RerankerChain
from ..validate import InvalidSetting
from .console import EXIT_FAILURE, EXIT_USAGE, fail
from .hints import SERVE_URL, TEI_UP, real_reranker_hint
from .model_load import load_model
from .options import ENV_OF_FIELD, OPTION_OF_FIELD, RerankerChoice, RerankOptions

__all__ = [
    "Chosen",
    "choose_reranker",
    "quiet_model_loading",
    "recall_embedder",
    "settings_of",
    "tiers_of",
]

EMBEDDING_WHAT = "cosine of sentence embeddings: a bi-encoder, not a cross-encoder"


@dataclass
class Chosen:
    """The reranker a command runs, how to describe it, and how to let it go.

    `why` says why ``auto`` passed over the better choices (None when it took the first);
    `embedder` is the `EmbeddingReranker` when the reranker is one, so dense recall can share
    it (one model in memory, document embeddings computed once).
    """

    reranker: Any
    label: str
    hint: str | None = None
    close: Callable[[], None] = field(default=lambda: None)
    why: str | None = None
    embedder: Any = None
    tiers: tuple[str, ...] = ()
    """A chain's tiers, each as the label names it (empty: not a chain)."""
    load_s: float | None = None
    """Seconds the in-process model took to load when it was chosen (None: nothing loaded)."""

    @property
    def base_url(self) -> str | None:
        """The service's URL when the reranker is an HTTP client (to scrub from messages)."""
        base_url = getattr(self.reranker, "base_url", None)
        return base_url if isinstance(base_url, str) else None


def quiet_model_loading() -> None:
    """Keep transformers' and the hub's own progress bars and advisories off the terminal.

    The command shows its own spinner and bar; the library never configures this (the
    application may). Set before transformers is imported; applied now if it already is.
    """
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import sys

    if "transformers" in sys.modules:
        logging = sys.modules["transformers"].utils.logging
        logging.set_verbosity_error()
        logging.disable_progress_bar()


def settings_of(options: RerankOptions) -> RerankSettings:
    """The options as `RerankSettings` (the first --endpoint's), checked by its rules; exit 2
    naming the option."""
    return tiers_of(options)[0]


def tiers_of(options: RerankOptions) -> list[RerankSettings]:
    """One `RerankSettings` per --endpoint, in order (one, disabled, without any); when one
    endpoint is given, the tiers ``RERANK_FALLBACKS`` lists follow it. --provider and --model
    are given once for every endpoint or once per endpoint; the first endpoint's key is
    --api-key, the n-th fallback's ``RERANK_API_KEY_<n>``. Exit 2 naming what is wrong."""
    endpoints = options.endpoint or [""]
    count = len(endpoints)
    providers = _per_endpoint(options.provider, count, "--provider")
    models = _per_endpoint(options.model, count, "--model")
    tiers: list[RerankSettings] = []
    for n, endpoint in enumerate(endpoints):
        try:
            tiers.append(
                RerankSettings(
                    endpoint=endpoint,
                    provider=providers[n] or "tei",
                    model=models[n],
                    api_key=options.api_key if n == 0 else os.environ.get(f"RERANK_API_KEY_{n}"),
                    api_key_header=(options.api_key_header or "") if n == 0 else "",
                    timeout=options.timeout,
                    batch_size=options.batch_size,  # type: ignore[arg-type] # text: parsed
                )
            )
        except InvalidSetting as exc:
            option = OPTION_OF_FIELD.get(exc.field, exc.field)
            if exc.field in options.from_env:  # the user typed the variable, not the option
                option = ENV_OF_FIELD[exc.field]
            if exc.field == "api_key" and n > 0:
                option = f"RERANK_API_KEY_{n}"
            which = f" (--endpoint {n + 1} of {count}, {shown_url(endpoint)})" if count > 1 else ""
            fail(EXIT_USAGE, f"{option}{which}: {scrubbed_message(exc.reason, endpoint)}")
    listed = os.environ.get(FALLBACKS, "")
    if count == 1 and tiers[0].enabled and listed.strip():
        fallbacks, problems = parse_fallbacks(listed, os.environ, timeout=options.timeout)
        if problems:
            fail(EXIT_USAGE, str(problems[0]))
        tiers += fallbacks
    return tiers


def _per_endpoint(values: list[str] | None, count: int, option: str) -> list[str | None]:
    """`values` spread over `count` endpoints: none, one for all, or one each."""
    if not values:
        return [None] * count
    if len(values) == 1:
        return [values[0]] * count
    if len(values) == count:
        return list(values)
    fail(
        EXIT_USAGE,
        f"{option} is given {len(values)} times for {count} --endpoint: give it once (for "
        "every endpoint) or once per --endpoint, in the same order",
    )


def choose_reranker(options: RerankOptions) -> Chosen:
    """An HTTP client for the endpoint (a chain over several); else the local cross-encoder,
    the embedding reranker or the lexical fallback, as ``--reranker`` says (``auto``: the
    first that loads)."""
    tiers = tiers_of(options)
    settings = tiers[0]
    choice = options.reranker
    precision = options.precision.value
    if precision != "fp32":
        # A precision is the embedding model's: auto then means it; anything else refuses.
        if choice is RerankerChoice.auto and not settings.endpoint:
            choice = RerankerChoice.embedding
        elif choice is not RerankerChoice.embedding or settings.endpoint:
            used = "--endpoint" if settings.endpoint else f"--reranker {choice.value}"
            fail(
                EXIT_USAGE,
                f"--precision {precision} is the embedding model's, not {used}'s",
                "use --reranker embedding without --endpoint (or serve --precision for a server)",
            )
    if settings.endpoint:
        if choice not in (RerankerChoice.auto, RerankerChoice.endpoint):
            fail(EXIT_USAGE, f"--reranker {choice.value} cannot be combined with --endpoint")
        if len(tiers) > 1:
            return _chain(tiers)
        return _endpoint(settings)
    if choice is RerankerChoice.endpoint:
        fail(EXIT_USAGE, "--reranker endpoint needs --endpoint URL (or RERANK_ENDPOINT)")
    if settings.provider == LOCAL and choice is RerankerChoice.auto:
        choice = RerankerChoice.local
    if choice is RerankerChoice.lexical:
        return _lexical()
    quiet_model_loading()
    local = dataclasses.replace(settings, provider=LOCAL)
    if choice is RerankerChoice.local:
        return _cross_encoder(local, strict=True)[0] or _unreachable()
    if choice is RerankerChoice.embedding:
        return _embedding(settings.model, strict=True, precision=precision)[0] or _unreachable()
    return _auto(local, precision)


def _chain(tiers: list[RerankSettings]) -> Chosen:
    """A `RerankerChain` over the tiers, with the chain settings of ``RERANK_CHAIN_TIMEOUT``
    and ``RERANK_BREAKER_*`` (exit 2 naming one that cannot be read)."""
    values, problems = chain_values(os.environ)
    if problems:
        fail(EXIT_USAGE, str(problems[0][1]))
    try:
        chain = make_chain(ChainSettings(tiers=tuple(tiers), **values), strict=True)
    except (TypeError, ValueError) as exc:  # a client's own checks
        fail(EXIT_USAGE, str(exc))
    assert isinstance(chain, RerankerChain)
    labels = tuple(_tier_label(t) for t in tiers)
    return Chosen(chain, "a chain of " + ", then ".join(labels), close=chain.close, tiers=labels)


def _tier_label(settings: RerankSettings) -> str:
    if settings.provider == LOCAL:
        return f"local cross-encoder {settings.model or ''}".rstrip()
    shown = f" model {settings.model}" if settings.model else ""
    return f"{settings.provider} at {shown_url(settings.endpoint)}{shown}"


def _unreachable() -> Chosen:  # pragma: no cover - strict choices exit instead
    raise AssertionError("a strict choice returned nothing")


def _endpoint(settings: RerankSettings) -> Chosen:
    try:
        client = make_reranker(settings, strict=True)
    except (TypeError, ValueError) as exc:  # the client's own checks
        fail(EXIT_USAGE, scrubbed_message(str(exc), settings.endpoint))
    assert isinstance(client, RerankClient)
    shown = f" model {settings.model}" if settings.model else ""
    label = f"{settings.provider} at {shown_url(client.base_url)}{shown}"
    return Chosen(client, label, close=client.close)


def _auto(settings: RerankSettings, precision: str = "fp32") -> Chosen:
    """The cross-encoder if one loads, else the embedding model, else lexical; `why` says
    what was passed over (a --model that is a bi-encoder becomes the embedding model)."""
    chosen, reason, bi_encoder = _cross_encoder(settings, strict=False)
    if chosen is not None:
        return chosen
    reasons = [reason]
    embedding_model = settings.model if bi_encoder else None
    chosen, reason, _ = _embedding(embedding_model, strict=False, precision=precision)
    if chosen is not None:
        chosen.why = f"auto: {reason_text(reasons)}"
        return chosen
    reasons.append(reason)
    return _lexical(reason_text(reasons))


def reason_text(reasons: list[str | None]) -> str:
    """The reasons, each once: both in-process models can fail for the same one."""
    return "; ".join(dict.fromkeys(r for r in reasons if r))


def _lexical(reason: str | None = None) -> Chosen:
    from ..local import LexicalReranker

    why = f"{reason}. " if reason else ""
    return Chosen(
        LexicalReranker(),
        "lexical (bag-of-words term coverage and proximity; not a model)",
        hint=f"{why}{real_reranker_hint()}",
    )


def _cross_encoder(
    settings: RerankSettings, *, strict: bool
) -> tuple[Chosen | None, str | None, bool]:
    """The cross-encoder from config's factory, loaded now: (chosen, None, False); else
    (None, why not, whether the model is a bi-encoder). `strict` exits instead."""
    from ..local import DEFAULT_LOCAL_MODEL, TORCH_INSTALL_HINT, local_available
    from ..local.model_source import (
        NotACrossEncoderError,
        hub_answers,
        hub_endpoint,
        hub_offline,
        on_disk,
    )

    name = settings.model or DEFAULT_LOCAL_MODEL
    if not local_available():
        if strict:
            fail(
                EXIT_USAGE,
                "--reranker local needs sentence-transformers (the [torch] extra)",
                TORCH_INSTALL_HINT,
            )
        return None, "sentence-transformers (for a cross-encoder) is not installed", False
    local_copy = on_disk(name) is not None
    if not local_copy and not hub_answers(name):
        hub = (
            "HF_HUB_OFFLINE is set"
            if hub_offline()
            else f"the Hugging Face hub at {hub_endpoint()} does not answer"
        )
        reason = f"{name} (a cross-encoder) is not on disk and {hub}"
        if strict:
            fail(
                EXIT_FAILURE,
                reason,
                "download it once with network access, or pass --model DIR (a cross-encoder "
                "directory), or --reranker embedding (runs offline), or a cross-encoder "
                f"service: TEI from the compose stack ({TEI_UP}) and --endpoint {SERVE_URL}",
            )
        return None, reason, False
    try:
        reranker: Any = make_reranker(settings, strict=True)
    except NotACrossEncoderError as exc:
        if strict:
            fail(EXIT_USAGE, f"--model {name}: {exc}")
        return None, f"{name} is a bi-encoder, not a cross-encoder", True
    reranker.local_files_only = local_copy  # found on disk: never ask the hub
    try:
        seconds = load_model(reranker, name)
    except RerankError as exc:
        if strict:
            fail(EXIT_FAILURE, str(exc))
        return None, f"the cross-encoder could not load ({exc})", False
    label = f"local cross-encoder {reranker.model_name} (in process)"
    return Chosen(reranker, label, close=reranker.close, load_s=seconds), None, False


def _embedding(
    model: str | None,
    *,
    strict: bool,
    asked_by: str = "--reranker embedding",
    precision: str = "fp32",
) -> tuple[Chosen | None, str | None, bool]:
    """The embedding reranker (default: the packaged all-MiniLM-L6-v2) at `precision`, loaded
    now, with an in-memory document-embedding cache; else (None, why not). `strict` exits
    instead. The label says the precision that runs when it is not fp32 (an int8 asked for
    where it cannot run is fp32, and the library's one warning line says why)."""
    from ..local import INSTALL_HINT, EmbeddingCache, EmbeddingReranker, embedding_available

    if not embedding_available():
        if strict:
            fail(EXIT_USAGE, f"{asked_by} needs the [local] extra", INSTALL_HINT)
        return None, "the [local] extra (the embedding model) is not installed", False
    try:
        reranker = EmbeddingReranker(model, cache=EmbeddingCache(), precision=precision)
    except (ImportError, ValueError) as exc:  # a backend named in the environment, missing
        if strict:
            fail(EXIT_USAGE, str(exc))
        return None, str(exc), False
    try:
        seconds = load_model(reranker, reranker.model_name)
    except RerankError as exc:
        if strict:
            fail(EXIT_FAILURE, str(exc), f"{INSTALL_HINT} brings the default embedding model")
        return None, f"the embedding model could not load ({exc})", False
    ran = reranker.precision
    where = "in process" if ran == "fp32" else f"in process, {ran}"
    if ran != precision:
        where += f", not {precision}: see the warning above"
    label = f"embedding model {reranker.model_name} ({where}; {EMBEDDING_WHAT})"
    chosen = Chosen(reranker, label, close=reranker.close, embedder=reranker, load_s=seconds)
    return chosen, None, False


def recall_embedder(chosen: Chosen) -> Any:
    """The embedding model dense recall uses: the reranker's own when it is one, else the
    default embedding model, loaded now (exit 1 when it cannot be)."""
    if chosen.embedder is not None:
        return chosen.embedder
    quiet_model_loading()
    made = _embedding(None, strict=True, asked_by="--recall dense/hybrid")[0]
    assert made is not None
    previous = chosen.close

    def close_both() -> None:
        previous()
        made.close()

    chosen.close = close_both
    chosen.embedder = made.embedder
    return made.embedder
