"""Choose the ranking weights on all five dev sets together, and check them leave-one-dataset-out.

    .venv/bin/python benchmarks/tune_search.py [--max-queries 400] [--passes 2] [--loo] [--only PARAM ...]

The method (issue 8): coordinate descent over a small grid of `RankingParams`
values. One parameter at a time takes each value of its grid, the others
fixed; the value kept is the one with the best objective over the datasets
tuned on. The objective is, per dataset and per gold rule (strict, lenient),
how far our MRR is along to the bar (`search_quality.target_ratio`: ≥ 1 meets
"1.05 × BM25's MRR, or 0.8 × its error rate"), taken as worst + mean: a change
that lifts one set by lowering another only counts if the worst set does not
fall. No rule names a dataset, a server or a tool; the grid is the same for
every set.

`--loo`: the same descent five times, each tuned on four datasets; the fifth
is scored with the weights tuned without it (and with the weights tuned on all
five, for comparison). Evaluations are memoised, so the five runs share work.
With `--from-prior` every descent starts from `PRIOR` (round textbook values
that saw no dataset), not from the shipped weights (which saw all five).

Queries are a fixed-seed sample of `--max-queries` per dataset (tuning speed);
the figures to report come from `search_quality.py` on every query.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from functools import lru_cache
from pathlib import Path
from typing import Any

from search_quality import DATA_DIR, bm25_rankings, build_index, evaluate, load_dataset, rank_ours, sample, target_ratio

import aggregator.catalog.search.documents as documents_module
from aggregator.catalog.search import DEFAULT_PARAMS, RankingParams
from aggregator.catalog.search.tokens import tokenize

# Every setting re-indexes the same texts: tokenise each text once per run.
documents_module.tokenize = lru_cache(maxsize=None)(tokenize)  # type: ignore[assignment]

GRID: dict[str, tuple[float, ...] | tuple[int, ...]] = {
    "name": (2.0, 3.0, 4.0),
    "params": (0.75, 1.0, 1.25),
    "server_name": (0.5, 1.0, 2.0),
    "server_description": (0.25, 0.5, 1.0),
    "name_b": (0.25, 0.5, 0.75),
    "description_b": (0.5, 0.75, 0.9),
    "k1": (0.9, 1.2, 1.6),
    "prefix": (0.2, 0.5),
    "substring": (0.1, 0.25),
    "stop_word": (0.0, 0.1, 0.2),
    "expansion": (0.2, 0.4),
    "expansion_absent": (0.55, 0.85),
    "title": (1.0, 2.0, 3.0),
    "stem_match": (0.3, 0.4, 0.5, 0.6, 0.7, 0.9),
    "inflection_match": (0.5, 0.6, 0.7, 0.9),
    "lexicon_tie": (0.0, 0.15, 0.3, 0.5, 1.0),
    "min_partial": (3, 4, 5),
    "number": (0.4, 0.7, 1.0),
    "related": (0.0, 0.1, 0.25),
    "related_absent": (0.0, 0.25, 0.4, 0.55),
    "common_slope": (0.0, 0.2, 0.35, 0.5),
    "common_pivot": (4.5, 4.75, 5.0),
    "coverage": (0.0, 0.05, 0.1, 0.15, 0.2),
    "related_rare": (0.0, 0.1, 0.2, 0.3),
    "rare_holders": (1, 2, 3),
    "meaning": (0.0, 0.3, 0.6, 0.9, 1.2),  # the five sets alone prefer more; everyday requests less (docs)
    "meaning_head": (10, 20, 30),
    "meaning_named": (0.0, 0.5, 0.75, 1.0),
}
# The starting point before any tuning: textbook BM25 values and round guesses, so that the
# leave-one-out runs start from weights that never saw the held-out set.
PRIOR = RankingParams(
    name=3.0,
    title=2.0,
    description=1.0,
    params=0.5,
    annotations=0.3,
    server_name=1.0,
    server_description=0.5,
    name_b=0.5,
    description_b=0.75,
    params_b=0.75,
    server_b=0.75,
    k1=1.2,
    stem_match=0.9,
    inflection_match=0.9,
    prefix=0.5,
    substring=0.25,
    stop_word=0.1,
    expansion=0.4,
    expansion_absent=0.7,
    lexicon_tie=0.3,
    min_partial=3,
    related_absent=0.25,
    common_slope=0.0,
    coverage=0.0,
    related_rare=0.0,
    meaning=0.0,
    meaning_named=0.0,
)
Scores = dict[str, dict[str, float]]  # dataset → {"strict": ratio to bar, "lenient": ratio to bar, ...}


class Evaluator:
    """MRR of a parameter setting on every dataset, memoised."""

    def __init__(self, paths: list[Path], max_queries: int | None) -> None:
        self.paths = paths
        self.max_queries = max_queries
        self.cache: dict[RankingParams, Scores] = {}
        self.bm25 = {}
        for path in paths:
            queries = sample(load_dataset(path).queries, max_queries)
            ranked = bm25_rankings(path, max_queries)
            self.bm25[path.stem] = {
                "strict": evaluate(zip(queries, ranked, strict=True))["mrr"],
                "lenient": evaluate(zip(queries, ranked, strict=True), lenient=True)["mrr"],
            }

    def scores(self, params: RankingParams) -> Scores:
        if params not in self.cache:
            out: Scores = {}
            for path in self.paths:
                dataset = load_dataset(path)
                queries = sample(dataset.queries, self.max_queries)
                index = build_index(dataset.servers, params)
                ranked = [rank_ours(index, q.text) for q in queries]
                strict = evaluate(zip(queries, ranked, strict=True))["mrr"]
                lenient = evaluate(zip(queries, ranked, strict=True), lenient=True)["mrr"]
                bm25 = self.bm25[path.stem]
                out[path.stem] = {
                    "strict": target_ratio(strict, bm25["strict"]),
                    "lenient": target_ratio(lenient, bm25["lenient"]),
                    "mrr": strict,
                    "mrr_lenient": lenient,
                }
            self.cache[params] = out
        return self.cache[params]


def objective(scores: Scores, datasets: list[str]) -> float:
    ratios = [scores[d][rule] for d in datasets for rule in ("strict", "lenient")]
    return min(ratios) + sum(ratios) / len(ratios)


def descend(
    ev: Evaluator, datasets: list[str], start: RankingParams, passes: int, only: list[str], log: bool
) -> RankingParams:
    best = start
    best_obj = objective(ev.scores(best), datasets)
    for n in range(passes):
        changed = False
        for name in only:
            for value in GRID[name]:
                candidate = replace(best, **{name: value})
                obj = objective(ev.scores(candidate), datasets)
                if obj > best_obj + 1e-4:
                    best, best_obj, changed = candidate, obj, True
                    if log:
                        print(f"  pass {n + 1}: {name}={value} → {obj:.4f}", file=sys.stderr, flush=True)
        if not changed:
            break
    return best


def _row(scores: Scores, datasets: list[str]) -> str:
    return "  ".join(f"{d}={scores[d]['mrr']:.3f}/{scores[d]['strict']:.3f}" for d in datasets)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-queries", type=int, default=400)
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--loo", action="store_true", help="also tune leave-one-dataset-out")
    parser.add_argument("--only", nargs="*", default=list(GRID), help="parameters to tune (default: all)")
    parser.add_argument("--from-prior", action="store_true", help="start from PRIOR, not the shipped weights")
    args = parser.parse_args(argv)
    paths = sorted(DATA_DIR.glob("*.json"))
    if not paths:
        print(f"no datasets in {DATA_DIR}", file=sys.stderr)
        return 2
    started = time.monotonic()
    ev = Evaluator(paths, args.max_queries)
    names = [p.stem for p in paths]
    print("shipped:", _row(ev.scores(DEFAULT_PARAMS), names), flush=True)
    start = PRIOR if args.from_prior else DEFAULT_PARAMS
    tuned = descend(ev, names, start, args.passes, args.only, log=True)
    changes = {k: v for k, v in asdict(tuned).items() if v != getattr(DEFAULT_PARAMS, k)}
    print("tuned on all five:", json.dumps(changes), flush=True)
    print("  ", _row(ev.scores(tuned), names), f"objective {objective(ev.scores(tuned), names):.4f}", flush=True)
    if args.loo:
        report: dict[str, Any] = {}
        for held in names:
            rest = [n for n in names if n != held]
            loo = descend(ev, rest, start, args.passes, args.only, log=False)
            s_loo, s_all = ev.scores(loo)[held], ev.scores(tuned)[held]
            report[held] = {
                "mrr_tuned_without": s_loo["mrr"],
                "mrr_tuned_with": s_all["mrr"],
                "vs_bar_without": round(s_loo["strict"], 4),
                "vs_bar_with": round(s_all["strict"], 4),
                "changes": {k: v for k, v in asdict(loo).items() if v != getattr(DEFAULT_PARAMS, k)},
            }
            print(f"leave out {held}:", json.dumps(report[held]), flush=True)
    print(f"{len(ev.cache)} settings evaluated in {time.monotonic() - started:.0f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
