"""The re-rank of the best results by closeness in meaning (`aggregator/catalog/search/meaning.py`):
the shipped table of word vectors, text vectors, and what the re-rank may and may not change."""

from __future__ import annotations

import gzip
import json
import math
import tomllib
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.catalog.model import Catalog
from aggregator.catalog.search import DEFAULT_PARAMS, RankingParams, ToolSearchIndex
from aggregator.catalog.search import index as index_module
from aggregator.catalog.search.meaning import WordVectors, cosine, word_vectors
from aggregator.catalog.store import CatalogStore
from tests.conftest import ROOT
from tests.test_search_rules import WORDS, build, ranked, synthetic

TABLE = ROOT / "aggregator" / "catalog" / "data" / "word_vectors.bin.gz"

CITY = synthetic(
    "s",
    {"name": "weather", "description": "Forecast for a city: rain, wind and temperature."},
    {"name": "guide", "description": "Restaurants, museums and hotels of a city."},
    {"name": "news", "description": "Local headlines of a city."},
)


def vector(text: str) -> tuple[float, ...]:
    table = word_vectors()
    assert table is not None
    found = table.text_vector(text.lower().split())
    assert found is not None, text
    return found


def test_the_shipped_table_holds_english_words_and_says_how_it_was_built() -> None:
    table = word_vectors()
    assert table is not None and len(table) > 50_000 and table.dims == 64
    for word in ("the", "weather", "invoice", "zebra", "aa"):
        assert table.row(word) is not None, word
    assert table.row("zzqqxxv") is None and table.row("") is None and table.row("Weather") is None
    header = json.loads(gzip.decompress(TABLE.read_bytes()).split(b"\n", 1)[0])
    assert header["dims"] == 64
    for said in ("all-MiniLM-L6-v2", "wordfreq", "CC BY-SA 4.0", "benchmarks/build_word_vectors.py"):
        assert said in header["about"], said
    package_data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    assert "data/*.bin.gz" in package_data["aggregator.catalog"]  # shipped in a wheel, not only in a clone


@settings(max_examples=80, deadline=None)
@given(
    words=st.sets(st.text(alphabet="abcz", min_size=1, max_size=4), min_size=1, max_size=30),
    probes=st.lists(st.text(alphabet="abcz", max_size=5), max_size=20),
)
def test_a_word_is_found_by_bisection_exactly_as_a_dict_finds_it(words: set[str], probes: list[str]) -> None:
    ordered = sorted(words)
    dims = 3
    rows = bytes((i * 7 + d) % 251 for i in range(len(ordered)) for d in range(dims))
    table = WordVectors("\n".join(ordered), rows, dims)
    position = {word: i for i, word in enumerate(ordered)}
    assert len(table) == len(ordered)
    for probe in [*ordered, *probes]:
        assert table.row(probe) == position.get(probe), probe


def test_a_table_whose_rows_do_not_match_its_words_is_refused() -> None:
    with pytest.raises(ValueError, match="bytes of rows"):
        WordVectors("a\nb", bytes(5), 3)


def test_text_vectors_are_unit_length_the_same_every_time_and_none_without_known_words() -> None:
    table = word_vectors()
    assert table is not None
    first = table.text_vector(["rain", "tomorrow", "zzqqxxv"])
    assert first is not None and math.isclose(math.sqrt(cosine(first, first)), 1.0, rel_tol=1e-9)
    assert first == table.text_vector(["rain", "tomorrow", "zzqqxxv"]) == table.text_vector(["rain", "tomorrow"])
    assert table.text_vector([]) is None and table.text_vector(["zzqqxxv"]) is None


def test_closeness_follows_what_the_words_mean() -> None:
    rain = vector("will it rain tomorrow")
    assert cosine(rain, vector("weather forecast")) > cosine(rain, vector("list the files of a directory"))
    invoice = vector("send the customer an invoice")
    assert cosine(invoice, vector("create a billing statement")) > cosine(invoice, vector("play a song"))


def test_among_tools_the_words_tie_on_the_one_meaning_the_request_comes_first() -> None:
    """ "chilly" is in no tool: by words the three tie on "city" (the order is the names'); the
    forecast's text is the one close in meaning, and `--explain` says what that added."""
    query = "is it going to be chilly in the city"
    words, _ = build([CITY])
    meaning, _ = build([CITY], params=DEFAULT_PARAMS)
    assert ranked(words, query)[0] == ("s", "news")
    assert ranked(meaning, query)[0] == ("s", "weather")
    [hit] = [h for h in meaning.search(query, 3) if h.tool == "weather"]
    matches = meaning.explain(query, "s", "weather")
    [part] = [m for m in matches if m.origin == "meaning"]
    assert part.term.startswith("closeness ") and part.contribution > 0
    assert sum(m.contribution for m in matches) == pytest.approx(hit.score)
    assert sum(m.contribution for m in words.explain(query, "s", "weather")) == pytest.approx(
        hit.score - part.contribution
    )


QUERY_WORDS = ["city", "rain", "chilly", "dinner", "museum", "headlines", "the", "in", "of", "local", "wind"]


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.sampled_from(QUERY_WORDS), min_size=1, max_size=6),
    head=st.integers(min_value=1, max_value=3),
    weight=st.floats(min_value=0.0, max_value=3.0),
)
def test_the_re_rank_only_raises_the_best_few_and_explain_adds_up(words: list[str], head: int, weight: float) -> None:
    """Whatever the weight and the head's size: the same tools match; a tool in the head by words
    gains at most `meaning` × the best score, one outside keeps its score; `search` is the top of
    the exhaustive scores; `explain` adds up to each score."""
    query = " ".join(words)
    plain, _ = build([CITY])
    index, _ = build([CITY], params=replace(DEFAULT_PARAMS, meaning=weight, meaning_head=head))
    before, after = plain.all_scores(query), index.all_scores(query)
    assert before.keys() == after.keys()
    by_words = sorted(before, key=lambda key: (-before[key], key))
    best = before[by_words[0]] if by_words else 0.0
    for key in by_words[head:]:
        assert after[key] == before[key]
    for key in by_words[:head]:
        assert before[key] <= after[key] <= before[key] + weight * best * (1 + 1e-9)
    expected = sorted(after, key=lambda key: (-after[key], key))
    assert ranked(index, query, 3) == expected[:3]
    for (server, tool), score in after.items():
        assert sum(m.contribution for m in index.explain(query, server, tool)) == pytest.approx(score)


def test_without_the_table_the_ranking_is_by_words(monkeypatch: pytest.MonkeyPatch) -> None:
    query = "is it going to be chilly in the city"
    words, _ = build([CITY])
    monkeypatch.setattr(index_module, "word_vectors", lambda: None)
    index, _ = build([CITY], params=DEFAULT_PARAMS)
    assert [(h.tool, h.score) for h in index.search(query, 3)] == [(h.tool, h.score) for h in words.search(query, 3)]
    assert not [m for m in index.explain(query, "s", "weather") if m.origin == "meaning"]


def test_a_tool_whose_text_changes_is_compared_by_its_new_text() -> None:
    """A tool's vector is made at the first search that needs it and forgotten with its document:
    after a catalog changes, the scores are those of an index built on the new catalog."""
    forecast = "Forecast for a city: rain, wind and temperature."
    guide = "Restaurants, museums and hotels of a city."

    def catalog(first: str, second: str) -> Catalog:
        return synthetic("s", {"name": "first", "description": first}, {"name": "second", "description": second})

    store = CatalogStore()
    index = ToolSearchIndex()
    index.attach(store)
    store.put(catalog(forecast, guide))
    query = "is it going to be chilly in the city"
    assert ranked(index, query)[0] == ("s", "first")
    store.put(catalog(guide, forecast))
    fresh, _ = build([catalog(guide, forecast)], params=DEFAULT_PARAMS)
    assert ranked(index, query)[0] == ("s", "second")
    assert index.all_scores(query) == fresh.all_scores(query)
    assert [(h.tool, h.score) for h in index.search(query, 3)] == [(h.tool, h.score) for h in fresh.search(query, 3)]


def test_the_same_catalog_and_query_give_the_same_floats() -> None:
    query = "where to eat dinner in the city"
    results = []
    for _ in range(2):
        index, _ = build([CITY], params=DEFAULT_PARAMS)
        results.append([(h.server, h.tool, h.score) for h in index.search(query, 3)])
    assert results[0] == results[1]
    assert WORDS.meaning == 0.0 < DEFAULT_PARAMS.meaning


def test_a_request_that_says_a_tool_s_whole_name_is_close_to_it() -> None:
    """Summed word vectors weigh topic more than the name: a sibling can be closer to "git diff"
    than `git_diff` (tests/test_catalog_search_tool.py). A tool whose whole name the request says
    counts as at least `meaning_named` close; one it names in part does not."""
    catalog = synthetic(
        "weather",
        {"name": "forecast", "description": "Hourly temperature, rain and wind for the coming days."},
        {"name": "forecast_alerts", "description": "Storm, flood and heat warnings in the forecast area."},
    )

    def closeness(params: RankingParams, query: str, tool: str) -> float:
        index, _ = build([catalog], params=params)
        [part] = [m for m in index.explain(query, "weather", tool) if m.origin == "meaning"]
        return float(part.term.removeprefix("closeness "))

    unnamed = replace(DEFAULT_PARAMS, meaning_named=0.0)
    assert closeness(unnamed, "forecast please", "forecast") < DEFAULT_PARAMS.meaning_named
    assert closeness(DEFAULT_PARAMS, "forecast please", "forecast") == DEFAULT_PARAMS.meaning_named
    assert closeness(DEFAULT_PARAMS, "forecast please", "forecast_alerts") == closeness(
        unnamed, "forecast please", "forecast_alerts"
    )


def test_a_tool_whose_name_has_no_words_is_not_named_by_every_request() -> None:
    """A name of no words ("_") is not a name every request says in full."""
    catalog = synthetic(
        "s",
        {"name": "_", "description": "Local headlines of a city."},
        {"name": "weather", "description": "Forecast for a city: rain, wind and temperature."},
    )
    index, _ = build([catalog], params=DEFAULT_PARAMS)
    [part] = [m for m in index.explain("is it going to be chilly in the city", "s", "_") if m.origin == "meaning"]
    assert float(part.term.removeprefix("closeness ")) < DEFAULT_PARAMS.meaning_named
