"""Top-k retrieval: the best documents for a query's groups of token sources, without scoring all.

A query word and the words the lexicon adds for it form one *group*, scored
as Lucene's dis_max: the group's best term counts in full, the others at the
share `lexicon_tie`. Synonyms are alternatives for one word of the request, so
a tool that repeats the concept in several words must not outscore one that
names it once. A document's score is the sum of its group values in sorted
query-word order, so the float sum does not depend on how it was found.

Retrieval uses MaxScore pruning over postings split into levels by falling
weight, so the long postings of common words are mostly probed for documents
that matched something rarer, not walked. Ties break on (server, tool).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import chain
from operator import itemgetter
from typing import Any

_HEAD = 32  # size of the first level of a postings list split by weight
BIG = 4 * _HEAD  # a token may read postings longer than this in place
LEAST_FACTOR = 0.5  # the coverage factor of a document that matches none of the weighted words
_BATCH = 128  # documents scored together during top-k retrieval


@dataclass(frozen=True, slots=True)
class Level:
    """Some documents of a postings list, and the highest weight among them."""

    bound: float
    docs: Sequence[int]


@dataclass(frozen=True, slots=True)
class Source:
    """Part of what a query token adds to a document's score: `scale × table[doc]`."""

    table: Mapping[int, float]
    scale: float
    levels: tuple[Level, ...]  # the table's documents by falling weight
    owned: bool = False  # built for this token (merged postings), not postings read in place


@dataclass(frozen=True, slots=True)
class TokenStats:
    """What one query token is worth: per document, the highest value over its sources."""

    sources: tuple[Source, ...]
    cards: dict[int, float]  # the same for server cards, worked out
    weight: float  # the token's rarity (idf over every tier); 0: matches nothing

    def scaled(self, factor: float) -> TokenStats:
        if factor == 1.0:
            return self
        sources = tuple(Source(s.table, s.scale * factor, s.levels, s.owned) for s in self.sources)
        return TokenStats(sources, {d: v * factor for d, v in self.cards.items()}, self.weight)


NO_MATCH = TokenStats((), {}, 0.0)
Group = tuple[tuple[Source, ...], ...]  # a query word and its lexicon words: each member's sources


@dataclass(frozen=True, slots=True)
class Combine:
    """How a query's group values make a document's score: the sum of its groups' values (dis_max
    within a group, `tie`), times the share of the query it covers to the power `coverage`.

    The share is the weight of the groups the document matches over that of all groups
    (`weights`, one per group: its query word's weight, a stop word's 0). A tool that one
    rare word lifts, and that says nothing of the rest of the request, then ranks below one
    that accounts for more of it. The factor is at most 1, so a document's summed values stay
    an upper bound of its score, which is what top-k pruning needs."""

    tie: float
    weights: tuple[float, ...] = ()
    coverage: float = 0.0
    damped: Mapping[int, frozenset[int]] = field(default_factory=dict)  # document → groups it holds ...
    damping: float = 1.0  # ... only in its name's object words, its name's verb not asked for: × this

    def factors(self, covered: Mapping[int, float]) -> dict[int, float]:
        """Per document, the factor of its `covered` weight (at least LEAST_FACTOR: a tool that
        matches only function words of a request keeps part of its score)."""
        whole = sum(self.weights)
        if whole <= 0 or self.coverage <= 0:
            return dict.fromkeys(covered, 1.0)
        return {d: max(LEAST_FACTOR, (c / whole) ** self.coverage) for d, c in covered.items()}


def stats_size(stats: TokenStats) -> int:
    """Entries a token's match tables hold of their own (postings read in place are not counted)."""
    own = sum(2 * len(s.table) for s in stats.sources if s.owned)  # the table and its levels
    return own + len(stats.cards) + 1


def split_levels(table: Mapping[int, float]) -> tuple[Level, ...]:
    """The table's documents by falling weight, in levels of _HEAD, 4×_HEAD, 16×_HEAD, ... entries.

    Top-k retrieval walks the best levels first; the long tail of a common word
    is then often provably unable to change the top k.
    """
    if len(table) <= _HEAD:
        return (Level(max(table.values(), default=0.0), list(table)),)
    ranked = sorted(table.items(), key=itemgetter(1), reverse=True)
    levels = []
    start, size = 0, _HEAD
    while start < len(ranked):
        level = ranked[start : start + size]
        levels.append(Level(level[0][1], [d for d, _ in level]))
        start += size
        size *= 4
    return tuple(levels)


def raise_to(best: dict[int, float], table: Mapping[int, float], scale: float) -> None:
    """best[d] = max(best[d], scale × table[d]) for every d in table."""
    if not best:
        best.update({d: scale * w for d, w in table.items()})
    else:
        best.update({d: v for d, w in table.items() if (v := scale * w) > best.get(d, 0.0)})


def token_values(docs: Mapping[int, Any], sources: Sequence[Source]) -> dict[int, float]:
    """Per document of `docs` that the token matches, its highest value over the sources.

    Each source is walked or probed, whichever is shorter.
    """
    values: dict[int, float] = {}
    for source in sources:
        table, scale = source.table, source.scale
        if len(table) <= len(docs):
            found = {d: scale * w for d, w in table.items() if d in docs}
        else:
            get = table.get
            found = {d: scale * w for d in docs if (w := get(d)) is not None}
        if not values:
            values = found
        else:
            values.update({d: v for d, v in found.items() if v > values.get(d, 0.0)})
    return values


def group_values(docs: Mapping[int, Any], group: Group, tie: float) -> dict[int, float]:
    """Per document of `docs` that the group matches: its best member's value plus `tie` × the others'."""
    if len(group) == 1:
        return token_values(docs, group[0])
    best: dict[int, float] = {}
    total: dict[int, float] = {}
    for member in group:
        for d, v in token_values(docs, member).items():
            total[d] = total.get(d, 0.0) + v
            if v > best.get(d, 0.0):
                best[d] = v
    return {d: b + tie * (total[d] - b) for d, b in best.items()}


def bulk_scores(docs: Iterable[int], groups: Sequence[Group], combine: Combine) -> dict[int, float]:
    """Full scores of `docs`: per document, the sum of its group values in group order, times its
    coverage factor (`Combine`).

    Group order is sorted query-word order, so a document's float sum does not
    depend on which documents were scored together or how they were found.
    """
    totals = dict.fromkeys(docs, 0.0)
    covered = dict.fromkeys(totals, 0.0) if combine.coverage > 0 else None
    weights = combine.weights or (0.0,) * len(groups)
    for position, (group, weight) in enumerate(zip(groups, weights, strict=True)):
        values = group_values(totals, group, combine.tie)
        if combine.damped:
            damped = combine.damped
            values.update({d: v * combine.damping for d, v in values.items() if position in damped.get(d, ())})
        totals.update({d: totals[d] + v for d, v in values.items()})
        if covered is not None and weight:
            covered.update({d: covered[d] + weight for d in values})
    if covered is None:
        return totals
    factors = combine.factors(covered)
    return {d: score * factors[d] for d, score in totals.items()}


class TopK:
    """Finds a set of documents, with exact scores, that surely holds the top `limit`.

    MaxScore pruning. Every source of every group (a query word and its lexicon
    words) is split into blocks (its levels, by falling value), taken from the
    highest bound down; their new documents are scored a batch at a time. A
    group's *ceiling* is what it can add to a document not seen so far: from
    the highest bound of each member's blocks not taken yet, combined as the
    group's values are (dis_max). Groups whose ceilings sum to less than the
    current `limit`-th best score become *non-essential*, for good: a document
    that only they match cannot reach the top, so their blocks are no longer
    walked (a document they match together with an essential group is found
    through that group's blocks, and scored in full). When every group is
    non-essential, retrieval is over.

    A document's score is at most the sum of its group values (the coverage
    factor is at most 1), so bounds on those sums prune soundly.

    Scoring a batch first adds group values in order of falling group bound and
    drops a document as soon as even the best values of its remaining groups
    could not lift it to the `limit`-th best score (most candidates of a common
    word go after one or two probes); survivors are then scored exactly, in
    sorted group order, so their floats do not depend on how they were found.
    """

    def __init__(self, groups: Sequence[Group], limit: int, combine: Combine) -> None:
        self.groups = groups
        self.limit = limit
        self.combine = combine
        self.tie = combine.tie
        # per group, its sources flattened: (member index, source)
        self.sources = [[(m, source) for m, member in enumerate(g) for source in member] for g in groups]
        self.taken = [[0] * len(sources) for sources in self.sources]  # per source, levels taken so far
        self.non_essential: set[int] = set()
        self.non_essential_sum = 0.0  # sum of their ceilings, frozen when they joined
        self.seen: set[int] = set()
        self.scored: dict[int, float] = {}
        self.best: list[float] = []  # the `limit` best scores so far, best first
        bounds = [self._ceiling(i) for i in range(len(groups))]
        self.order = sorted(range(len(groups)), key=lambda i: -bounds[i])
        self.rest = [0.0] * (len(groups) + 1)  # rest[p]: sum of the bounds of order[p:]
        for pos in range(len(groups) - 1, -1, -1):
            self.rest[pos] = self.rest[pos + 1] + bounds[self.order[pos]]

    def run(self) -> dict[int, float]:
        blocks = sorted(
            (-source.scale * level.bound, i, j, k)
            for i, sources in enumerate(self.sources)
            for j, (_, source) in enumerate(sources)
            for k, level in enumerate(source.levels)
        )
        batch: dict[int, None] = {}
        for _, i, j, k in blocks:
            if len(batch) >= _BATCH or (len(self.best) < self.limit <= len(self.best) + len(batch)):
                self._score(batch)
                batch = {}
            self._update_non_essential()
            if len(self.non_essential) == len(self.groups):
                break
            if i in self.non_essential:
                continue
            self.taken[i][j] = k + 1
            batch.update((d, None) for d in self.sources[i][j][1].levels[k].docs if d not in self.seen)
        self._score(batch)
        return self.scored

    def _full(self) -> bool:
        return len(self.best) >= self.limit

    def _ceiling(self, i: int) -> float:
        """The most group `i` can add to a document in none of its blocks taken so far."""
        member_bounds = [0.0] * len(self.groups[i])
        for (m, source), k in zip(self.sources[i], self.taken[i], strict=True):
            if k < len(source.levels):
                member_bounds[m] = max(member_bounds[m], source.scale * source.levels[k].bound)
        top = max(member_bounds, default=0.0)
        return top + self.tie * (sum(member_bounds) - top)

    def _update_non_essential(self) -> None:
        if not self._full():
            return
        floor = self.best[-1] * (1 - 1e-9)
        ceilings = {i: self._ceiling(i) for i in range(len(self.groups)) if i not in self.non_essential}
        for i in sorted(ceilings, key=lambda i: (ceilings[i], i)):
            if self.non_essential_sum + ceilings[i] >= floor:
                break
            self.non_essential.add(i)
            self.non_essential_sum += ceilings[i]

    def _score(self, batch: dict[int, None]) -> None:
        self.seen.update(batch)
        alive: dict[int, float] = dict.fromkeys(batch, 0.0)
        if self._full():
            floor = self.best[-1] * (1 - 1e-9)
            for pos, i in enumerate(self.order):
                values = group_values(alive, self.groups[i], self.tie)
                alive.update({d: alive[d] + v for d, v in values.items()})
                rest = self.rest[pos + 1]
                alive = {d: s for d, s in alive.items() if s + rest >= floor}
                if not alive:
                    return
        fresh = bulk_scores(alive, self.groups, self.combine)
        self.scored.update(fresh)
        self.best = heapq.nlargest(self.limit, chain(self.best, fresh.values()))


def top(items: list[tuple[int, float]], limit: int, names: Callable[[int], tuple[str, str]]) -> list[tuple[int, float]]:
    """The `limit` best (document, score) pairs: score descending, ties on `names` (server, tool)."""
    if limit <= 0 or not items:
        return []
    if len(items) > limit:
        threshold = heapq.nlargest(limit, items, key=itemgetter(1))[-1][1]
        items = [item for item in items if item[1] >= threshold]
    return sorted(items, key=lambda item: (-item[1], *names(item[0])))[:limit]
