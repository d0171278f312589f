"""Rebuild `aggregator/catalog/data/word_vectors.bin.gz`, the search's table of word vectors.

    .venv/bin/pip install -e ".[dense]" wordfreq
    .venv/bin/python benchmarks/build_word_vectors.py [--words 60000] [--dims 64] [--smoothing 0.001]

The search re-ranks its best lexical results by how close in meaning a tool's text is
to the request (`aggregator/catalog/search/meaning.py`), with text vectors summed from
this table's word vectors: no model is loaded at run time. Steps, all deterministic:

1. Vocabulary: the `--words` most frequent English words of `wordfreq`
   (`top_n_list("en", N)`), kept when alphabetic ASCII and at least two letters long.
2. Each word is embedded alone by all-MiniLM-L6-v2 (`dense_reference.embed`: unit length).
3. The common direction is removed: the first principal direction of the vectors weighted
   by the square root of each word's frequency (what every text's sum shares, whatever it
   says; the "common component" of Arora et al., 2017, "A simple but tough-to-beat baseline
   for sentence embeddings").
4. The vectors are projected on their `--dims` principal directions (centred), each
   direction's sign fixed so that its largest entry is positive.
5. Each row is scaled by its word's weight `a / (a + frequency)` (`--smoothing` a, the
   same paper's smooth inverse frequency: "the" counts for almost nothing, "invoice" fully)
   and the table is quantised to signed bytes on one scale (a cosine needs no unit).

Measured in docs/search-quality.md (issue 23, sixth round): the five dev sets and the everyday
requests, alone and as a re-rank of ours. The file is gzip (mtime 0, so the bytes are
reproducible) of: one line of JSON (`about`: how it was built and under which licences;
`dims`; `words_bytes`), the words joined by newlines (sorted), a newline, then
`len(words) × dims` signed bytes. Licences: the model Apache-2.0, the word list wordfreq's
data, CC BY-SA 4.0, so the table is CC BY-SA 4.0 too. No rule names a dataset, a server or a tool.
"""

from __future__ import annotations

import argparse
import gzip
import json
import sys
from pathlib import Path

import numpy as np
from dense_reference import available, embed

OUT = Path(__file__).resolve().parents[1] / "aggregator" / "catalog" / "data" / "word_vectors.bin.gz"


def vocabulary(size: int) -> list[str]:
    from wordfreq import top_n_list

    return sorted({w for w in top_n_list("en", size) if w.isascii() and w.isalpha() and len(w) >= 2})


def frequencies(words: list[str]) -> np.ndarray:
    from wordfreq import word_frequency

    return np.array([word_frequency(w, "en") for w in words], dtype=np.float64)


def vectors(words: list[str], freq: np.ndarray, dims: int, smoothing: float) -> np.ndarray:
    """Steps 2 to 5: the quantised, weighted rows, one per word."""
    v = embed(words).astype(np.float64)
    _, _, vt = np.linalg.svd(v * np.sqrt(freq)[:, None], full_matrices=False)
    common = vt[:1]
    v = v - (v @ common.T) @ common
    _, _, vt = np.linalg.svd(v - v.mean(axis=0), full_matrices=False)
    axes = vt[:dims]
    axes *= np.sign(axes[np.arange(dims), np.abs(axes).argmax(axis=1)])[:, None]
    v = (v @ axes.T) * (smoothing / (smoothing + freq))[:, None]
    return np.round(v * (127.0 / np.abs(v).max())).astype(np.int8)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--words", type=int, default=60000)
    parser.add_argument("--dims", type=int, default=64)
    parser.add_argument("--smoothing", type=float, default=0.001)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args(argv)
    if (missing := available()) is not None:
        print(missing, file=sys.stderr)
        return 2
    words = vocabulary(args.words)
    rows = vectors(words, frequencies(words), args.dims, args.smoothing)
    block = "\n".join(words).encode("ascii")
    header = {
        "about": (
            f"Word vectors for the tool search's re-rank by meaning: the {len(words)} alphabetic words of "
            f"wordfreq's {args.words} most frequent English words, each embedded alone by "
            f"sentence-transformers/all-MiniLM-L6-v2 (Apache-2.0), the common direction removed, projected on "
            f"{args.dims} principal directions, scaled by {args.smoothing} / ({args.smoothing} + frequency), "
            "signed bytes. Built by benchmarks/build_word_vectors.py. The word list is wordfreq's data "
            "(CC BY-SA 4.0; https://github.com/rspeer/wordfreq), so this table is CC BY-SA 4.0."
        ),
        "dims": args.dims,
        "words_bytes": len(block),
    }
    payload = json.dumps(header, sort_keys=True).encode("utf-8") + b"\n" + block + b"\n" + rows.tobytes()
    args.out.write_bytes(gzip.compress(payload, compresslevel=9, mtime=0))
    print(f"{len(words)} words × {args.dims} → {args.out} ({args.out.stat().st_size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
