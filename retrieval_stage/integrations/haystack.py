"""`RetrievalStageRerank` for Haystack 3: a component that reranks through `RerankStage`.

From a clone: ``pip install -e '.[haystack]'``. Add it to a pipeline after a retriever
(``pipeline.add_component("rerank", RetrievalStageRerank(settings=...))``) and connect
``retriever.documents`` to ``rerank.documents``.

Tracing: OpenInference's Haystack instrumentor gives a component a RERANKER span of its own
(with no recall scores) when the class name contains ``"Ranker"``. This class is named
``...Rerank``, so the instrumentor gives it a plain component span, and the one RERANKER span in
the trace is the stage's, nested inside it. Keep the name when subclassing (a subclass called
``MyRanker`` gets two RERANKER spans); the integration tests pin this.

`to_dict`/`from_dict` (and so ``pipeline.dumps()``/``loads()``) round-trip a component built
from `RerankSettings` or from the environment. The API key is never written out: it is
serialised as Haystack's environment-variable secret ``RERANK_API_KEY``.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any
from urllib.parse import urlsplit

from haystack import Document, component, default_from_dict, default_to_dict
from haystack.utils import Secret

from retrieval_stage import Candidate, Reranked
from retrieval_stage.config import API_KEY, RerankSettings

from ._common import RERANKED, RETRIEVAL_SCORE, Stages, candidate_id, recall_score

__all__ = ["RetrievalStageRerank"]

_PLAIN_OPTIONS = frozenset(
    {"model_name", "on_error", "min_score", "max_content_length", "output_content"}
)
"""Stage options `to_dict` can write: plain values. A tracer or meter provider, or a
TraceConfig, is an object of the running process: give it again after `from_dict`."""


@component
class RetrievalStageRerank:
    """Rerank documents with a `RerankStage`: best first, rerank score in ``Document.score``.

    `reranker` is any reranker of ours or an object with ``rerank(query, items, *, text,
    top_k)``; or give `settings` (a `RerankSettings`) to build the clients through
    `retrieval_stage.config`; with neither, the ``RERANK_*`` environment decides when the
    component is made (reranking off when no endpoint is set). `top_k` keeps the best k;
    ``run(top_k=...)`` overrides it for one call. `stage_options` are `RerankStage`'s.

    The recall score (``Document.score`` on the way in) is the span's input score and comes
    back as ``meta["retrieval_score"]``. After a fallback the documents come back in recall
    order with their recall scores unchanged and ``meta["reranked"]`` False.
    """

    def __init__(
        self,
        reranker: Any = None,
        *,
        top_k: int | None = None,
        settings: RerankSettings | None = None,
        **stage_options: Any,
    ) -> None:
        self._stages = Stages(reranker, top_k=top_k, settings=settings, stage_options=stage_options)
        self._settings_given = settings is not None
        self.top_k = top_k
        self.stage_options = stage_options

    @component.output_types(documents=list[Document])
    def run(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """The documents reranked for `query`, best first (copies); `top_k` for this call."""
        results = self._stages.sync().run(query, _candidates(documents), top_k=top_k)
        return {"documents": _documents(documents, results)}

    @component.output_types(documents=list[Document])
    async def run_async(
        self, query: str, documents: list[Document], top_k: int | None = None
    ) -> dict[str, list[Document]]:
        """Async `run`; an awaitable reranker is awaited, not threaded."""
        stage = self._stages.asynchronous()
        results = await stage.arun(query, _candidates(documents), top_k=top_k)
        return {"documents": _documents(documents, results)}

    # -- serialisation -----------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        """Plain settings and stage options; the API key as the ``RERANK_API_KEY`` secret.

        Refuses (``ValueError``) what cannot be written safely or at all: a reranker object,
        a key that ``RERANK_API_KEY`` does not hold, credentials in the endpoint URL, and
        non-plain stage options (tracer or meter providers, a TraceConfig).
        """
        if self._stages.reranker is not None:
            raise ValueError(
                "RetrievalStageRerank built from a reranker object cannot be serialised: "
                "build it from settings=RerankSettings(...) (or the RERANK_* environment)"
            )
        other = sorted(set(self.stage_options) - _PLAIN_OPTIONS)
        if other:
            raise ValueError(
                f"stage options {other} are objects of this process and cannot be serialised: "
                "set them after loading, or use the global providers"
            )
        settings = self._stages.settings if self._settings_given else None
        return default_to_dict(
            self,
            top_k=self.top_k,
            settings=None if settings is None else _settings_to_dict(settings),
            **self.stage_options,
        )

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RetrievalStageRerank:
        """The component `to_dict` wrote; the key resolved from its environment variable."""
        data = copy.deepcopy(data)
        params = data.setdefault("init_parameters", {})
        if params.get("settings") is not None:
            params["settings"] = _settings_from_dict(params["settings"])
        built: RetrievalStageRerank = default_from_dict(cls, data)
        return built


def _settings_to_dict(settings: RerankSettings) -> dict[str, Any]:
    parts = urlsplit(settings.endpoint)
    if parts.username is not None or parts.password is not None:
        raise ValueError(
            "the endpoint carries credentials in its URL and cannot be serialised: "
            f"give the key through {API_KEY} instead"
        )
    key: dict[str, Any] | None = None
    if settings.api_key is not None:
        if os.environ.get(API_KEY, "").strip() != settings.api_key:
            raise ValueError(
                f"the API key is serialised as a reference to {API_KEY}, which does not hold "
                f"this key: set {API_KEY} to it (the key itself is never written out)"
            )
        key = Secret.from_env_var(API_KEY, strict=False).to_dict()
    return {
        "endpoint": settings.endpoint,
        "provider": settings.provider,
        "model": settings.model,
        "api_key": key,
        "api_key_header": settings.api_key_header,
        "timeout": settings.timeout,
        "batch_size": settings.batch_size,
    }


def _settings_from_dict(data: dict[str, Any]) -> RerankSettings:
    values = dict(data)
    key = values.pop("api_key", None)
    api_key = Secret.from_dict(key).resolve_value() if key is not None else None
    return RerankSettings(**values, api_key=api_key)


def _candidates(documents: Sequence[Document]) -> list[Candidate]:
    return [
        Candidate(
            id=candidate_id(d.id, i),
            text=d.content or "",
            score=recall_score(d.score),
            metadata=dict(d.meta),
        )
        for i, d in enumerate(documents)
    ]


def _documents(originals: Sequence[Document], results: Sequence[Reranked]) -> list[Document]:
    return [_copy(originals[r.input_index], r) for r in results]


def _copy(original: Document, result: Reranked) -> Document:
    """A deep copy of the document with the rerank score, the recall score kept in meta."""
    document = copy.deepcopy(original)
    meta = document.meta
    if result.candidate.score is not None:
        meta[RETRIEVAL_SCORE] = result.candidate.score
    meta[RERANKED] = result.reranked
    # After a fallback the slot keeps exactly what recall put there.
    score = result.score if result.reranked else original.score
    return replace(document, meta=meta, score=score)
