"""The full-text index engine: tokenizer, query parser, matching, scoring, highlights, backends."""

from __future__ import annotations

import math
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import aggregator.textindex.sqlite as sqlite_backend
from aggregator.textindex import IndexRegistry, TextIndexError, TokenizerConfig, parse_query, tokenize
from aggregator.textindex.engine import TextIndex, rank_top
from aggregator.textindex.highlight import make_highlights, spans
from aggregator.textindex.memory import MemoryIndex
from aggregator.textindex.readcache import ReadCache
from aggregator.textindex.sqlite import SqliteIndex
from aggregator.textindex.tokenizer import TokenizerConfigError

DEFAULT = TokenizerConfig()


def search(index: TextIndex, query: str, k: int = 10) -> tuple[list[tuple[str, float]], int]:
    outcome = index.search(parse_query(query, index.config), k)
    return [(hit.doc_id, hit.score) for hit in outcome.hits], outcome.total_matches


@pytest.fixture(params=["memory", "sqlite"])
def index(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[TextIndex]:
    made: TextIndex
    if request.param == "memory":
        made = MemoryIndex("t", DEFAULT)
    else:
        made = SqliteIndex.create("t", tmp_path / "t.sqlite3", DEFAULT)
    yield made
    made.close()


# --- tokenizer ---


def test_seed_example_has_six_tokens() -> None:
    tokens = tokenize("Python rate limiting with token buckets", DEFAULT)
    assert [t.text for t in tokens] == ["python", "rate", "limiting", "with", "token", "buckets"]


def test_tokens_are_word_runs_with_spans_and_run_positions() -> None:
    text = "A snake_case getUserProfile, café-Ünïcode 42!"
    tokens = tokenize(text, DEFAULT)
    assert [t.text for t in tokens] == ["snake_case", "getuserprofile", "café", "ünïcode", "42"]
    assert [t.position for t in tokens] == [1, 2, 3, 4, 5]  # "a" is run 0, dropped by min_length 2
    assert all(text[t.start : t.end].lower() == t.text for t in tokens)


def test_tokenizer_config_lowercase_and_min_length() -> None:
    config = TokenizerConfig(lowercase=False, min_length=3)
    assert [t.text for t in tokenize("The API is an Api of APIs", config)] == ["The", "API", "Api", "APIs"]


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("x", "tokenizer_config must be an object"),
        ({"lowercase": "yes"}, "tokenizer_config.lowercase must be a boolean"),
        ({"min_length": True}, "tokenizer_config.min_length must be an integer"),
        ({"min_length": 2.5}, "tokenizer_config.min_length must be an integer"),
        ({"min_length": 0}, "tokenizer_config.min_length must be between 1 and 1000"),
        ({"stem": True}, "Unknown tokenizer_config field: stem (known fields: lowercase, min_length)"),
    ],
)
def test_tokenizer_config_validation(raw: Any, message: str) -> None:
    with pytest.raises(TokenizerConfigError) as caught:
        TokenizerConfig.from_dict(raw)
    assert str(caught.value) == message


def test_tokenizer_config_defaults() -> None:
    assert TokenizerConfig.from_dict(None) == TokenizerConfig.from_dict({}) == TokenizerConfig(True, 2)


# --- query parser ---


def test_query_parser_seed_example() -> None:
    parsed = parse_query('+python "machine learning"', DEFAULT)
    assert parsed.to_dict() == {
        "terms": [],
        "must": ["python"],
        "must_not": [],
        "phrases": ["machine learning"],
    }


def test_query_parser_operators_and_normalization() -> None:
    parsed = parse_query('Rate rate +API -legacy -"old way" rate-limiting +rate "unclosed Phrase', DEFAULT)
    assert parsed.to_dict() == {
        "terms": ["limiting"],
        "must": ["api", "rate"],
        "must_not": ["legacy", "old way"],
        "phrases": ["unclosed phrase"],
    }


def test_query_parser_drops_empty_parts() -> None:
    parsed = parse_query('+ - "" a "x" +b !!!', DEFAULT)
    assert parsed.is_empty
    assert parsed.to_dict() == {"terms": [], "must": [], "must_not": [], "phrases": []}


def test_phrase_offsets_count_dropped_runs() -> None:
    (phrase,) = parse_query('"state of the art"', TokenizerConfig(min_length=3)).phrases
    assert phrase.tokens == ("state", "the", "art")
    assert phrase.offsets == (0, 2, 3)


# --- the operator table of DESIGN §2.5, on both backends ---

CORPUS = {
    "d1": "python machine learning with numpy",
    "d2": "learning machine code in rust",
    "d3": "python web frameworks and python tooling",
    "d4": "rust and python interop",
    "d5": "the machine room",
}


def load(index: TextIndex, corpus: dict[str, str] = CORPUS) -> None:
    for doc_id, text in corpus.items():
        index.add(doc_id, text, {"id": doc_id})


@pytest.mark.parametrize(
    ("query", "expected"),
    [
        ("python", {"d1", "d3", "d4"}),  # bare term
        ("python rust", {"d1", "d2", "d3", "d4"}),  # bare terms: any one suffices
        ("+python rust", {"d1", "d3", "d4"}),  # + required, bare optional
        ("+python +rust", {"d4"}),
        ("python -rust", {"d1", "d3"}),  # - excluded
        ('"machine learning"', {"d1"}),  # consecutive, in order
        ('"learning machine"', {"d2"}),
        ('"python machine" learning', {"d1"}),  # a phrase makes bare terms optional
        ('machine -"machine learning"', {"d2", "d5"}),
        ("-python", set()),  # only - terms: nothing
        ("-python -rust", set()),
        ("+python -python", set()),
        ("+absent python", set()),
        ("nothing here", set()),
    ],
)
def test_operator_table(index: TextIndex, query: str, expected: set[str]) -> None:
    load(index)
    hits, total = search(index, query)
    assert {doc for doc, _ in hits} == expected
    assert total == len(expected)


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_phrase_keeps_the_place_of_dropped_runs(tmp_path: Path, backend: str) -> None:
    config = TokenizerConfig(min_length=3)
    index: TextIndex = (
        MemoryIndex("m", config) if backend == "memory" else SqliteIndex.create("s", tmp_path / "s", config)
    )
    corpus = {"a": "state of the art", "b": "state is the art", "c": "state the art", "d": "the state art"}
    load(index, corpus)
    assert {doc for doc, _ in search(index, '"state of the art"')[0]} == {"a", "b"}
    assert {doc for doc, _ in search(index, '"state the art"')[0]} == {"c"}
    assert {doc for doc, _ in search(index, '"the art" -"state of the"')[0]} == {"c"}
    index.close()


def test_score_formula_and_tie_break(index: TextIndex) -> None:
    load(index, {"a": "alpha beta beta", "c": "beta gamma", "b": "gamma delta"})
    assert search(index, "beta") == ([("a", 2.0), ("c", 1.0)], 2)  # idf = ln(3/3)+1 = 1
    alpha = round(math.log(3 / 2) + 1, 6)
    assert search(index, "alpha gamma") == ([("a", alpha), ("b", 1.0), ("c", 1.0)], 3)  # tie: doc_id
    # a phrase's tokens score like bare ones, duplicates count once
    assert search(index, '"beta beta" beta') == ([("a", 2.0)], 1)


def test_total_matches_counts_before_k(index: TextIndex) -> None:
    load(index)
    hits, total = search(index, "python machine", k=2)
    assert len(hits) == 2
    assert total == 5


def test_results_carry_metadata_and_highlights(index: TextIndex) -> None:
    load(index)
    outcome = index.search(parse_query("numpy", index.config), 10)
    (hit,) = outcome.hits
    assert hit.metadata == {"id": "d1"}
    assert hit.highlights == ["python machine learning with numpy"]


def test_case_sensitive_index(tmp_path: Path) -> None:
    index = MemoryIndex("cs", TokenizerConfig(lowercase=False))
    index.add("a", "API docs", {})
    index.add("b", "api docs", {})
    assert search(index, "API") == ([("a", round(math.log(2 / 2) + 1, 6))], 1)


# --- highlights ---


def highlights(text: str, query: str, config: TokenizerConfig = DEFAULT) -> list[str]:
    return make_highlights(text, config, parse_query(query, config))


def test_highlight_is_token_aligned() -> None:
    text = "Rapid prototyping matters. " + "filler " * 20 + "Our API is documented."
    assert highlights(text, "api") == ["...filler filler filler Our API is documented."]


def test_highlight_window_does_not_cut_words() -> None:
    text = "0123456789 abcdefghijklmnopqrstuvwxyz target abcdefghijklmnopqrstuvwxyz 0123456789"
    (snippet,) = highlights(text, "target")
    assert snippet == "...abcdefghijklmnopqrstuvwxyz target abcdefghijklmnopqrstuvwxyz..."
    long_words = "x" * 40 + " target " + "y" * 40
    assert highlights(long_words, "target") == ["...target..."]


def test_at_most_three_highlights_in_document_order() -> None:
    text = " ".join(f"word{i} " + "pad " * 20 for i in range(6)) + " needle " + "pad " * 20 + " needle"
    found = highlights(text, "needle word0 word1 word2 word3")
    assert len(found) == 3
    # distinct query parts before second occurrences: the needle is shown though it comes last
    assert any("needle" in snippet for snippet in found)
    positions = [text.index(snippet.strip(".").split()[0]) for snippet in found]
    assert positions == sorted(positions)


def test_highlights_never_show_excluded_parts_and_show_phrases() -> None:
    text = "beta first. " + "pad " * 20 + "a machine learning course. " + "pad " * 20 + "machine"
    found = highlights(text, 'machine -beta "learning course"')
    # 30 characters around the phrase: "a machine " and 5 pads before, ". " and 7 pads after
    phrase_snippet = "..." + "pad " * 5 + "a machine learning course." + " pad" * 7 + "..."
    assert found == [phrase_snippet, "..." + "pad " * 7 + "machine"]
    assert highlights("alpha beta", "beta -beta") == []  # an excluded term is never a match
    assert highlights("room for a machine", 'machine -"machine room"') == ["room for a machine"]


def test_overlapping_windows_merge() -> None:
    found = highlights("one two three four five", "one five")
    assert found == ["one two three four five"]


HIGHLIGHT_WORDS = [
    "api",
    "API",
    "rapid",
    "Api_x",
    "σς",
    "ΟΔΟΣ",
    "İstanbul",
    "istanbul",
    "a",
    "of",
    "the",
    "x1",
]


@st.composite
def highlight_cases(draw: st.DrawFn) -> tuple[str, str, TokenizerConfig]:
    words = st.sampled_from(HIGHLIGHT_WORDS)
    separators = st.sampled_from([" ", "-", ". ", "'", "\n", "_"])
    text = "".join(draw(words) + draw(separators) for _ in range(draw(st.integers(1, 30))))
    parts = [draw(st.sampled_from(["", "+", "-"])) + draw(words) for _ in range(draw(st.integers(0, 3)))]
    phrase = " ".join(draw(words) for _ in range(draw(st.integers(1, 3))))
    query = " ".join([*parts, f'"{phrase}"'])
    config = TokenizerConfig(lowercase=draw(st.booleans()), min_length=draw(st.integers(1, 3)))
    return text, query, config


@settings(max_examples=300, deadline=None)
@given(highlight_cases())
def test_highlight_search_equals_tokenizing(case: tuple[str, str, TokenizerConfig]) -> None:
    """The str.find fast path finds exactly the tokens the tokenizer cuts."""
    text, query, config = case
    for words in (query, "api rapid ΟΔΟΣ istanbul of"):
        parsed = parse_query(words, config)
        assert spans(text, config, parsed) == spans(text, config, parsed, search=False)


def test_ranking_ties_on_rounded_scores() -> None:
    scores = {"b": 1.0000004, "a": 1.0000001, "c": 0.5, "d": 1.0000049}
    assert rank_top(scores, 1) == [("d", 1.000005)]
    assert rank_top(scores, 2) == [("d", 1.000005), ("a", 1.0)]  # a and b tie once rounded: doc_id decides
    assert rank_top(scores, 9) == [("d", 1.000005), ("a", 1.0), ("b", 1.0), ("c", 0.5)]
    assert rank_top({}, 3) == []


# --- re-indexing ---


def test_reindex_replaces_and_is_idempotent(index: TextIndex) -> None:
    assert index.add("x", "alpha beta", {"v": 1}).status == "indexed"
    once = index.state()  # type: ignore[attr-defined]
    assert index.add("x", "alpha beta", {"v": 1}).status == "re-indexed"
    assert index.state() == once  # type: ignore[attr-defined]
    index.add("x", "gamma delta gamma", {"v": 2})
    assert search(index, "alpha") == ([], 0)
    assert index.state() == {  # type: ignore[attr-defined]
        "docs": {"x": ("gamma delta gamma", {"v": 2})},
        "postings": {"delta": {"x": (1,)}, "gamma": {"x": (0, 2)}},
        "tf": {"delta": {"x": 1}, "gamma": {"x": 2}},
    }
    assert index.doc_count() == 1


# --- memory and sqlite agree, and agree with a brute-force oracle ---

# fsync costs nothing on tmpfs: keeps the many sqlite files of the property test cheap
FAST_TMP = "/dev/shm" if Path("/dev/shm").is_dir() else None
WORDS = ["alpha", "Alpha", "beta", "BETA", "gamma", "delta", "ep", "z", "zeta_eta", "née", "42"]
SEPARATORS = [" ", " ", ", ", "-", "\n", ". "]


@st.composite
def documents(draw: st.DrawFn) -> str:
    words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=12))
    seps = draw(st.lists(st.sampled_from(SEPARATORS), min_size=len(words), max_size=len(words)))
    return "".join(w + s for w, s in zip(words, seps, strict=True))


@st.composite
def queries(draw: st.DrawFn) -> str:
    parts = []
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["", "", "+", "-", '"', '-"']))
        words = draw(st.lists(st.sampled_from(WORDS), min_size=1, max_size=3 if '"' in kind else 1))
        parts.append(f'{kind}{" ".join(words)}"' if '"' in kind else kind + words[0])
    return " ".join(parts)


def oracle(corpus: dict[str, str], config: TokenizerConfig, query: str) -> tuple[list[tuple[str, float]], int]:
    """Brute force over each document's token list, straight from DESIGN §2.5."""
    parsed = parse_query(query, config)

    def has_phrase(tokens: list[Any], phrase: Any) -> bool:
        at = {t.position: t.text for t in tokens}
        return any(
            all(at.get(t.position + off) == word for off, word in zip(phrase.offsets, phrase.tokens, strict=True))
            for t in tokens
        )

    docs = {d: tokenize(text, config) for d, text in corpus.items()}
    texts = {d: [t.text for t in tokens] for d, tokens in docs.items()}
    matched = []
    for d, tokens in docs.items():
        words = set(texts[d])
        required = parsed.must or parsed.phrases
        ok = all(m in words for m in parsed.must) and all(has_phrase(tokens, p) for p in parsed.phrases)
        ok = ok if required else bool(words & set(parsed.terms))
        ok = ok and not words & set(parsed.must_not)
        ok = ok and not any(has_phrase(tokens, p) for p in parsed.excluded_phrases)
        if ok:
            matched.append(d)
    n = len(corpus)
    scores = {}
    for d in matched:
        score = 0.0
        for term in parsed.positive:
            df = sum(term in texts[other] for other in corpus)
            score += texts[d].count(term) * (math.log(n / (df + 1)) + 1)
        scores[d] = round(score, 6)
    ranked = sorted(matched, key=lambda d: (-scores[d], d))
    return [(d, scores[d]) for d in ranked[:5]], len(matched)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    corpus=st.dictionaries(st.sampled_from([f"doc{i}" for i in range(8)]), documents(), min_size=1),
    rewrites=st.lists(st.tuples(st.sampled_from([f"doc{i}" for i in range(8)]), documents()), max_size=3),
    lowercase=st.booleans(),
    min_length=st.integers(1, 3),
    query_list=st.lists(queries(), min_size=1, max_size=6),
)
def test_memory_equals_sqlite_equals_oracle(
    corpus: dict[str, str],
    rewrites: list[tuple[str, str]],
    lowercase: bool,
    min_length: int,
    query_list: list[str],
) -> None:
    config = TokenizerConfig(lowercase=lowercase, min_length=min_length)
    with tempfile.TemporaryDirectory(dir=FAST_TMP) as tmp:
        memory = MemoryIndex("m", config)
        sqlite = SqliteIndex.create("s", Path(tmp) / "s.sqlite3", config)
        current: dict[str, str] = {}

        def check_queries() -> None:
            for query in query_list:
                parsed = parse_query(query, config)
                from_memory = memory.search(parsed, 5)
                assert from_memory == sqlite.search(parsed, 5), query
                hits = [(hit.doc_id, hit.score) for hit in from_memory.hits]
                assert (hits, from_memory.total_matches) == oracle(current, config, query), query

        # searching between the rewrites also checks the sqlite read cache follows the adds
        for batch in ([*corpus.items()], *([rewrite] for rewrite in rewrites)):
            for doc_id, text in batch:
                current[doc_id] = text
                for index in (memory, sqlite):
                    index.add(doc_id, text, {"doc": doc_id, "len": len(text)})
            check_queries()
        assert memory.state() == sqlite.state()
        sqlite.close()


# --- registry and persistence ---


def test_registry_default_and_lazy_sqlite(tmp_path: Path) -> None:
    data = tmp_path / "data"
    registry = IndexRegistry(data)
    assert registry.get("default").backend == "memory"
    registry.create("notes", "memory", DEFAULT)
    assert not data.exists()  # nothing on disk until a sqlite index is created
    index = registry.create("docs", "sqlite", TokenizerConfig(lowercase=False, min_length=3))
    index.add("a", "Persistent Index", {"k": [1, 2]})
    assert (data / "indexes" / "docs.sqlite3").is_file()
    registry.close()

    reopened = IndexRegistry(data)
    assert reopened.open_names() == ["default"]  # nothing read at start-up
    again = reopened.get("docs")
    assert again.config == TokenizerConfig(lowercase=False, min_length=3)
    assert search(again, "Persistent") == ([("a", round(math.log(1 / 2) + 1, 6))], 1)
    assert reopened.open_names() == ["default", "docs"]
    with pytest.raises(TextIndexError, match=r"^Index not found: notes$"):
        reopened.get("notes")  # memory indexes do not survive
    reopened.close()


@pytest.mark.parametrize("name", ["default", "docs", "mem"])
def test_registry_refuses_existing_names(tmp_path: Path, name: str) -> None:
    first = IndexRegistry(tmp_path)
    first.create("docs", "sqlite", DEFAULT)
    first.create("mem", "memory", DEFAULT)
    with pytest.raises(TextIndexError, match=rf"^Index already exists: {name}$"):
        first.create(name, "memory", DEFAULT)
    other = IndexRegistry(tmp_path)  # another process: sees the file, not the memory index
    with pytest.raises(TextIndexError, match=r"^Index already exists: docs$"):
        other.create("docs", "sqlite", DEFAULT)
    first.close()
    other.close()


@pytest.mark.parametrize("name", ["", "a b", "../x", "x" * 65, "ü", "name\n"])
def test_registry_refuses_bad_names(tmp_path: Path, name: str) -> None:
    registry = IndexRegistry(tmp_path)
    for call in (lambda: registry.get(name), lambda: registry.create(name, "sqlite", DEFAULT)):
        with pytest.raises(TextIndexError, match=r"^Invalid index name"):
            call()
    assert not tmp_path.joinpath("indexes").exists()


def test_registry_reports_unreadable_files(tmp_path: Path) -> None:
    (tmp_path / "indexes").mkdir()
    (tmp_path / "indexes" / "bad.sqlite3").write_bytes(b"not a database at all" * 100)
    with pytest.raises(TextIndexError, match=r"^Index could not be opened: bad: bad\.sqlite3 is not an index file"):
        IndexRegistry(tmp_path).get("bad")


CRASH_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from aggregator.textindex import IndexRegistry, TokenizerConfig
    import aggregator.textindex.sqlite as backend

    index = IndexRegistry(Path(sys.argv[1])).create("crash", "sqlite", TokenizerConfig())
    for i in range(5):
        index.add(f"doc{i}", f"document item{i} alpha", {"i": i})
    real_pack = backend._pack

    def dying_pack(positions):
        os._exit(17)  # mid-transaction: the document row is written, its postings are not

    backend._pack = dying_pack
    index.add(sys.argv[2], "beta gamma", {})
    """
)


@pytest.mark.parametrize("victim", ["doc5", "doc2"])  # a new document, and a replacement
def test_crash_mid_add_loses_nothing_added_before(tmp_path: Path, victim: str) -> None:
    run = subprocess.run([sys.executable, "-c", CRASH_SCRIPT, str(tmp_path), victim], timeout=30, check=False)
    assert run.returncode == 17
    index = IndexRegistry(tmp_path).get("crash")
    assert index.doc_count() == 5
    assert search(index, "alpha", k=10)[1] == 5
    assert search(index, "beta") == ([], 0)
    assert [hit.doc_id for hit in index.search(parse_query('"item2 alpha"', DEFAULT), 5).hits] == ["doc2"]
    index.close()


def test_failed_add_rolls_back_and_the_index_stays_usable(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    index = SqliteIndex.create("r", tmp_path / "r.sqlite3", DEFAULT)
    index.add("a", "alpha beta", {})
    before = index.state()
    assert search(index, "alpha")[1] == 1  # fills the read cache

    def broken(positions: list[int]) -> bytes:
        raise RuntimeError("disk on fire")

    monkeypatch.setattr(sqlite_backend, "_pack", broken)
    for doc_id in ("a", "b"):  # a replacement and a new document
        with pytest.raises(RuntimeError):
            index.add(doc_id, "gamma alpha", {})
    assert index.state() == before
    assert search(index, "alpha gamma") == search(index, "alpha")
    assert search(index, "alpha")[1] == 1
    monkeypatch.undo()
    index.add("b", "gamma alpha", {})
    assert search(index, "alpha")[1] == 2
    index.close()


def test_concurrent_adds_are_safe(tmp_path: Path) -> None:
    """Threads on one connection, and a second registry (a second process's connection) at once."""
    first = IndexRegistry(tmp_path)
    first.create("shared", "sqlite", DEFAULT)
    second = IndexRegistry(tmp_path)
    targets = [first.get("shared"), second.get("shared"), first.get("default")]
    for index in targets:
        index.add("w0-0", "common word0 item0 stale", {})
        assert search(index, "common stale")[1] == 1  # warm each connection's read cache
    errors: list[BaseException] = []

    def writer(worker: int) -> None:
        try:
            for i in range(15):
                for index in targets:
                    index.add(f"w{worker}-{i}", f"common word{worker} item{i}", {"w": worker})
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    expected = search(targets[2], "common stale +word3", k=100)
    assert len(expected[0]) == 15
    for index in targets:
        assert index.doc_count() == 6 * 15
        assert search(index, "common", k=1)[1] == 90
        assert search(index, "stale")[1] == 0  # w0-0 was replaced through the other connection
        assert search(index, "common stale +word3", k=100) == expected  # same N, df and tf everywhere
    assert first.get("shared").state() == first.get("default").state()  # type: ignore[attr-defined]
    first.close()
    second.close()


def test_read_cache_follows_other_connections(tmp_path: Path) -> None:
    """A search after another process's commit sees it (the cache is dated by data_version)."""
    one = SqliteIndex.create("c", tmp_path / "c.sqlite3", DEFAULT)
    two = SqliteIndex.open("c", tmp_path / "c.sqlite3")
    one.add("a", "alpha beta", {})
    assert search(two, "alpha") == ([("a", round(math.log(1 / 2) + 1, 6))], 1)
    one.add("b", "alpha", {})
    one.add("a", "beta only", {})
    assert search(two, "alpha") == ([("b", round(math.log(2 / 2) + 1, 6))], 1)
    two.add("c", "alpha alpha", {})
    assert search(one, "alpha") == search(two, "alpha")
    assert [doc for doc, _ in search(one, "alpha")[0]] == ["c", "b"]
    one.close()
    two.close()


def test_read_cache_eviction_keeps_results() -> None:
    cache = ReadCache(max_postings=6)  # a term costs its postings + 1
    cache.store("a", {"d1": 1, "d2": 1})
    cache.store("b", {"d1": 2})
    assert cache.frequencies("a") is not None  # a is now the most recently used
    cache.store("c", {"d3": 1, "d4": 1})
    assert cache.frequencies("b") is None
    assert cache.frequencies("a") == {"d1": 1, "d2": 1}
    cache.after_add(9, "d9", old={}, new={"a": 3}, created=True)
    assert cache.frequencies("a") == {"d1": 1, "d2": 1, "d9": 3}
    assert cache.doc_ids == {9: "d9"}
    cache.check_version(7)
    assert cache.frequencies("a") is None
