"""How close in meaning a request and a tool are, from a shipped table of word vectors.

The lexical ranking (`index`, `retrieval`) decides which tools match; among its
best few (`RankingParams.meaning_head`), a tool whose text is close in meaning to
the request moves up: each adds `RankingParams.meaning` × the best score × the
cosine of the two texts' vectors (at least 0; `ToolSearchIndex.meaning_boosts`), so
"is it going to rain in Oslo" prefers the forecast tool to another that only shares
"Oslo".

A text's vector is the sum of its words' rows in `data/word_vectors.bin.gz`
(distilled offline from all-MiniLM-L6-v2 by `benchmarks/build_word_vectors.py`:
each word embedded alone, the direction every text shares removed, 64 principal
directions, rows pre-weighted by how rare the word is, signed bytes). Words
outside the table count for nothing. No model is loaded at run time: a sum of
byte rows and a dot product, in a fixed order, so the same texts always give the
same float.
"""

from __future__ import annotations

import gzip
import json
import math
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable
from functools import cache, lru_cache
from importlib import resources
from itertools import accumulate
from operator import add, mul
from typing import TypeAlias

from aggregator.heap import release_freed_memory

# unit length, 4-byte floats: a tool's 64 cost 320 bytes (a tuple of floats would cost 2 KiB)
Vector: TypeAlias = "array[float]"


class WordVectors:
    """The table: sorted words in one string, and their rows of `dims` signed bytes.

    A word is found by bisection over the words' offsets, not a dict: 57,000 str
    objects and their dict would cost about 6 MiB more than the table itself."""

    def __init__(self, words: str, rows: bytes, dims: int) -> None:
        self._words = words
        self._starts = array("I", [0, *accumulate(len(word) + 1 for word in words.split("\n")[:-1])])
        self._rows = memoryview(rows).cast("b")
        self.dims = dims
        # cached: a catalog's words repeat from tool to tool
        self.row: Callable[[str], int | None] = lru_cache(maxsize=16384)(self._find)
        if len(self._rows) != len(self._starts) * dims:
            raise ValueError(f"{len(self._rows)} bytes of rows for {len(self._starts)} words of {dims}")

    def __len__(self) -> int:
        return len(self._starts)

    def _word(self, i: int) -> str:
        end = self._starts[i + 1] - 1 if i + 1 < len(self._starts) else len(self._words)
        return self._words[self._starts[i] : end]

    def _find(self, word: str) -> int | None:
        """The row of `word`, or None when the table does not hold it."""
        i = bisect_left(range(len(self._starts)), word, key=self._word)
        return i if i < len(self._starts) and self._word(i) == word else None

    def text_vector(self, words: Iterable[str]) -> Vector | None:
        """The unit-length sum of the rows of `words` (lower-case tokens), or None when the table
        holds none of them."""
        dims, rows = self.dims, self._rows
        total: list[int] | None = None
        for word in words:
            i = self.row(word)
            if i is not None:
                row = rows[i * dims : (i + 1) * dims]
                total = list(map(add, total, row)) if total is not None else list(row)
        norm = math.sqrt(sum(map(mul, total, total))) if total is not None else 0
        return array("f", [x / norm for x in total]) if total is not None and norm else None


def cosine(a: Vector, b: Vector) -> float:
    return sum(map(mul, a, b))


@cache
def word_vectors() -> WordVectors | None:
    """The shipped table (`data/word_vectors.bin.gz`), loaded at the first search; None when absent."""
    path = resources.files("aggregator.catalog").joinpath("data/word_vectors.bin.gz")
    if not path.is_file():
        return None
    payload = gzip.decompress(path.read_bytes())
    head_end = payload.index(b"\n")
    header = json.loads(payload[:head_end])
    words_end = head_end + 1 + int(header["words_bytes"])
    words = payload[head_end + 1 : words_end].decode("ascii")
    table = WordVectors(words, payload[words_end + 1 :], int(header["dims"]))
    del payload
    release_freed_memory()  # the decompressed payload: megabytes the C heap would keep
    return table
