"""Which tier of a reranker chain answered, and why the ones before it did not, said in words.

The chain writes it on the RERANKER span (``retrieval_stage.tier`` for the tier that answered,
a ``rerank.tier_failed`` or ``rerank.tier_skipped`` event per tier that did not); `TierLog`
reads it there as each span ends, so the command says what the trace says, never a guess.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import ReadableSpan
from rich.console import Console
from rich.text import Text

from ..spans.keys import ATTR_TIER

__all__ = ["Missed", "TierOutcome", "failover_words", "say_tiers", "tier_outcome"]

_SKIPPED = {"circuit_open": "skipped: its circuit is open", "deadline": "skipped: no time was left"}


@dataclass(frozen=True, slots=True)
class Missed:
    """One tier that did not answer: its position and why (the span event's words)."""

    tier: int
    why: str


@dataclass(frozen=True, slots=True)
class TierOutcome:
    """One chain call as its span tells it: the tier that answered (None: none did) and the
    tiers tried before, in order."""

    answered: int | None
    missed: tuple[Missed, ...]


def _index(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def tier_outcome(span: ReadableSpan) -> TierOutcome | None:
    """The chain call a finished span records, or None when no chain ran under it."""
    missed: list[Missed] = []
    for event in span.events:
        fields = event.attributes or {}
        tier = _index(fields.get("tier"))
        if tier is None:
            continue
        if event.name == "rerank.tier_failed":
            cause, error = fields.get("caused_by"), fields.get("error")
            missed.append(
                Missed(tier, f"failed: {cause}: {error}" if error else f"failed: {cause}")
            )
        elif event.name == "rerank.tier_skipped":
            reason = str(fields.get("reason"))
            missed.append(Missed(tier, _SKIPPED.get(reason, f"skipped: {reason}")))
    answered = _index((span.attributes or {}).get(ATTR_TIER))
    if answered is None and not missed:
        return None
    return TierOutcome(answered, tuple(missed))


def _named(tier: int, labels: Sequence[str]) -> str:
    return f"tier {tier} ({labels[tier]})" if 0 <= tier < len(labels) else f"tier {tier}"


def failover_words(outcome: TierOutcome, labels: Sequence[str]) -> str | None:
    """``tier 0 (tei at URL) failed: RerankStatusError: ...; tier 1 (jina at URL) answered``;
    None when the call never reached the chain's answer (the error message says that case)."""
    if outcome.answered is None:
        return None
    said = [f"{_named(m.tier, labels)} {m.why}" for m in outcome.missed]
    said.append(f"{_named(outcome.answered, labels)} answered")
    return "; ".join(said)


def say_tiers(console: Console, chosen: Any, calls: Sequence[TierOutcome]) -> None:
    """For a chain, one line after the result: which tier answered the last call, and (as
    ``failover:``, in yellow) why the tiers before it did not."""
    if not chosen.tiers or not calls:
        return
    words = failover_words(calls[-1], chosen.tiers)
    if words is None:
        return
    if calls[-1].missed:
        console.print(Text("failover: ", style="bold yellow") + Text(words, style="yellow"))
    else:
        console.print(Text(words, style="dim"))
