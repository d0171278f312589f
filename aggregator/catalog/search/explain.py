"""`--explain`: how a tool's score for a query is made, term by term (the sum is the score)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

from aggregator.catalog.search.query import QueryTerm, coverage_weights
from aggregator.catalog.search.retrieval import Combine
from aggregator.catalog.search.scoring import FIELDS

ScaledTerms = Callable[[str, bool], list[tuple[str, str, float]]]  # (token, partial) → (term, tier, idf × factor)


@dataclass(frozen=True, slots=True)
class Match:
    """One query term's part of a tool's score (`ToolSearchIndex.explain`)."""

    query_term: str
    origin: str  # "query", "stop word" or "lexicon: <query word>"
    term: str  # the vocabulary term it matched
    tier: str  # exact, stem, prefix or substring
    fields: tuple[str, ...]  # the tool's fields holding that term
    contribution: float  # what it added, the tool's coverage factor included
    coverage: float = 1.0  # the tool's coverage factor for the query (`retrieval.Combine`)


def explain(
    qterms: Sequence[QueryTerm],
    scaled_terms: ScaledTerms,
    doc_terms: Mapping[str, float],
    fields: Mapping[str, list[str]],
    tie: float,
    coverage: float = 0.0,
    damped: tuple[frozenset[str], float] = (frozenset(), 1.0),
) -> list[Match]:
    """Per query term (by query word, sorted), the vocabulary term of the document that counted,
    its tier, the fields holding it, and what it added: the best of a word's group in full,
    the others at the share `tie`, as the ranking adds them (`retrieval.group_values`), each
    times the document's coverage factor (`retrieval.Combine`); a query word in `damped[0]` (it
    matches the tool's name object, not its verb: `ToolSearchIndex._damped`) × `damped[1]`."""
    matches = []
    weights = coverage_weights(list(qterms))
    searched_weights: list[float] = []
    covered = 0.0
    for word in sorted({q.word for q in qterms}):
        found = []
        searched = False  # the word matches something in the catalog: it has a group
        for qterm in (q for q in qterms if q.word == word):
            best: tuple[float, str, str] | None = None
            for term, tier, scale in scaled_terms(qterm.token, qterm.partial):
                searched = True
                weight = doc_terms.get(term)
                if weight is not None and (best is None or qterm.weight * scale * weight > best[0]):
                    best = (qterm.weight * scale * weight, term, tier)
            if best is not None:
                found.append((qterm, best))
        searched_weights += [weights[word]] if searched else []
        covered += weights[word] if found else 0.0
        top = max(found, key=lambda item: item[1][0], default=None)
        for qterm, (value, term, tier) in found:
            share = 1.0 if (qterm, (value, term, tier)) == top else tie
            share *= damped[1] if word in damped[0] else 1.0
            holding = tuple(f for f in FIELDS if term in fields.get(f, ()))
            matches.append(Match(qterm.token, qterm.origin, term, tier, holding, share * value))
    factor = Combine(tie, tuple(searched_weights), coverage).factors({0: covered})[0]
    return [replace(m, contribution=m.contribution * factor, coverage=factor) for m in matches]
