"""Rebuild `aggregator/catalog/data/common_words.json`: how common each common English word is.

    .venv/bin/pip install wordfreq
    .venv/bin/python benchmarks/build_common_words.py [--words 40000] [--min-zipf 4.0]

The search weighs a word of the query less the more common it is in English at
large (`RankingParams.common_slope`): in "find me an apartment near the
station", "apartment" says more about the tool wanted than "find" or "near",
however rare "near" is in one catalog (the catalog's idf cannot know that). The
table holds the Zipf frequency (log10 of occurrences per billion words, to one
decimal) of each of the `--words` most frequent English words of `wordfreq`
that is alphabetic ASCII and at least `--min-zipf` frequent: rarer words are
never weighed down. Words are grouped by frequency, one string per value.

Deterministic: the same wordfreq version gives the same bytes. No word comes
from a benchmark's queries; no rule names a dataset, a server or a tool.
Licence: wordfreq's data is CC BY-SA 4.0, so the table is too (its `about` block
says so).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OUT = Path(__file__).resolve().parents[1] / "aggregator" / "catalog" / "data" / "common_words.json"


def frequencies(size: int, floor: float) -> dict[str, list[str]]:
    """Zipf frequency (one decimal, as text) → the words that common, sorted."""
    from wordfreq import top_n_list, zipf_frequency

    groups: dict[str, list[str]] = {}
    for word in sorted({w for w in top_n_list("en", size) if w.isascii() and w.isalpha()}):
        zipf = round(zipf_frequency(word, "en"), 1)
        if zipf >= floor:
            groups.setdefault(f"{zipf:.1f}", []).append(word)
    return groups


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=40000)
    parser.add_argument("--min-zipf", type=float, default=4.0)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    try:
        groups = frequencies(args.words, args.min_zipf)
    except ImportError:
        print("needs wordfreq: pip install wordfreq", file=sys.stderr)
        return 2
    about = {
        "what": "Zipf frequency in English (log10 per billion words) of common words, for "
        "catalog_search_tools: a query word weighs less the more common it is.",
        "built_by": f"benchmarks/build_common_words.py --words {args.words} --min-zipf {args.min_zipf}",
        "words": f"the {args.words} most frequent English words of wordfreq (code Apache-2.0, data CC BY-SA 4.0)",
        "licence": "CC BY-SA 4.0 (the word list's licence)",
    }
    entries = ",\n".join(f"    {json.dumps(z)}: {json.dumps(' '.join(groups[z]))}" for z in sorted(groups))
    head = json.dumps(about, indent=4).replace("\n", "\n  ")
    text = '{\n  "about": ' + head + ',\n  "zipf": {\n' + entries + "\n  }\n}\n"
    json.loads(text)  # well-formed
    args.out.write_text(text, encoding="utf-8")
    count = sum(len(words) for words in groups.values())
    print(f"{count} words in {len(groups)} frequency groups; {len(text)} bytes to {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
