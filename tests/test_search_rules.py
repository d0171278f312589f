"""Tokenizer, query vocabulary and ranking rules of catalog_search_tools (DESIGN §2.2), on
small synthetic catalogs: these need no data beside the repository. The rules are those of the
ranking by words (`WORDS`); the re-rank of the best by meaning has its own tests
(test_search_meaning.py)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from aggregator.catalog.model import Catalog, clean_tool, sorted_unique
from aggregator.catalog.search import DEFAULT_PARAMS, RankingParams, ToolSearchIndex, annotation_tokens
from aggregator.catalog.search.query import (
    Commonness,
    QueryTerm,
    RelatedTerms,
    _parse_related,
    common_words,
    lexicon,
    query_terms,
    related_terms,
)
from aggregator.catalog.search.retrieval import LEAST_FACTOR
from aggregator.catalog.search.tokens import (
    dotted_words,
    identifiers,
    inflection_pair,
    is_cjk,
    names,
    stem,
    tokenize,
)
from aggregator.catalog.store import CatalogStore
from aggregator.tools.catalog_search import format_explanation

WORDS = replace(DEFAULT_PARAMS, meaning=0.0)  # the ranking by words alone, without the re-rank by meaning


def synthetic(server: str, *tools: Mapping[str, Any], hidden: Iterable[str] = ()) -> Catalog:
    hide = set(hidden)
    entries = [clean_tool(server, dict(t), hidden=t["name"] in hide) for t in tools]
    return Catalog(server, sorted_unique(entries))


def build(
    catalogs: Iterable[Catalog],
    metadata: Mapping[str, tuple[str, list[str]]] | None = None,
    params: RankingParams = WORDS,
) -> tuple[ToolSearchIndex, CatalogStore]:
    store = CatalogStore()
    index = ToolSearchIndex(params)
    index.attach(store)
    for server, (description, caps) in (metadata or {}).items():
        index.set_server_metadata(server, description, caps)
    for catalog in catalogs:
        store.put(catalog)
    return index, store


def ranked(index: ToolSearchIndex, query: str, limit: int = 50) -> list[tuple[str, str]]:
    return [(h.server, h.tool) for h in index.search(query, limit)]


def terms_and_first(query: str, *tools: Mapping[str, Any]) -> tuple[dict[str, QueryTerm], str]:
    """Over one server's `tools`: the query's terms by token, and the name of its first result."""
    index, _ = build([synthetic("s", *tools)])
    return {t.token: t for t in index.query_terms(query)}, ranked(index, query)[0][1]


# ---------------------------------------------------------------- tokenizer


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("getUserProfile", ["get", "user", "profile"]),
        ("get_user-profile.v2/x", ["get", "user", "profile", "v2", "x"]),
        ("HTTPServer base64Encode", ["http", "server", "base64", "encode"]),
        ("list URLs and IDs", ["list", "urls", "and", "ids"]),
        ("mcp-server-time: convert_time()", ["mcp", "server", "time", "convert", "time"]),
        ("Café résumé", ["café", "résumé"]),
        ("搜索结果", ["搜索", "索结", "结果"]),
        ("用bing搜索", ["用", "bing", "搜索"]),
        ("", []),
        ("  \t ", []),
    ],
)
def test_tokenize(text: str, tokens: list[str]) -> None:
    assert tokenize(text) == tokens


@pytest.mark.parametrize(
    ("text", "tokens"),
    [
        ("use get_file, then getTimeEntries", ["get_file", "get_time_entries"]),
        ("excel-write-to-sheet on monthly_data.xlsx", ["excel_write_to_sheet", "monthly_data_xlsx"]),
        ("HTTPServer a__b", ["http_server", "a_b"]),
        ("plain words only, no identifiers", []),
        ("_ - . __", []),
        ("", []),
    ],
)
def test_identifiers(text: str, tokens: list[str]) -> None:
    assert identifiers(text) == tokens


def test_stem_folds_plurals_and_verb_endings_on_both_sides() -> None:
    pairs = [("converts", "convert"), ("converting", "converted"), ("files", "file"), ("queries", "query")]
    for a, b in [*pairs, ("pictures", "picture"), ("running", "run"), ("observations", "observation")]:
        assert stem(a) == stem(b)
    assert stem("status") == "status"
    assert stem("git") == "git"  # short tokens stay
    assert stem("résumés") == "résumés"  # non-ASCII stays
    assert is_cjk("搜索") and not is_cjk("search")


def test_stop_words_weigh_less_and_lexicon_words_are_not_stop_words() -> None:
    terms = {t.token: t for t in query_terms(tokenize("show me the picture"), 0.1, 0.3)}
    assert terms["show"].weight == terms["picture"].weight == 1.0  # tool vocabulary, though on the stop list
    assert terms["the"].weight == terms["me"].weight == 0.1
    assert terms["image"].weight == 0.3 and terms["image"].origin == "lexicon: picture"
    only_stop = query_terms(tokenize("about"), 0.1, 0.3)
    assert [(t.token, t.weight) for t in only_stop] == [("about", 1.0)]  # nothing else to search for
    assert "the" in lexicon().stop_words and "open" not in lexicon().stop_words


def test_words_a_request_hinges_on_are_not_stop_words() -> None:
    """The generic stop list is made for prose: "the latest", "top 10", "turn on the tv" need those words."""
    for word in ("latest", "newest", "top", "first", "name", "tv", "turn", "recent", "oldest"):
        assert word not in lexicon().stop_words, word
    terms = {t.token: t for t in query_terms(tokenize("show the latest news"), 0.1, 0.3)}
    assert terms["latest"].weight == 1.0 and terms["the"].weight == 0.1


def test_numbers_weigh_less_than_words() -> None:
    """A date or an amount in a side clause ("Today is 2023-03-17.") is rarely what the request is about."""
    terms = {
        t.token: t for t in query_terms(tokenize("Today is 2023-03-17. Book a flight"), 0.1, 0.3, number_weight=0.7)
    }
    assert terms["2023"].weight == terms["17"].weight == 0.7 and terms["book"].weight == 1.0
    assert DEFAULT_PARAMS.number < 1.0


def test_related_terms_bridge_a_word_the_catalog_never_uses() -> None:
    """The shipped table (distilled offline from an embedding model) lends a word absent from the
    catalog its related words, below the query's own words; a word the catalog holds lends none."""
    assert related_terms()["rows"] and all(0 < sim <= 1 for _, sim in related_terms()["rows"])
    catalog = synthetic(
        "db",
        {"name": "describe", "description": "Describe a table and its schema."},
        {"name": "backup", "description": "Copy the database file."},
    )
    index, _ = build([catalog])
    assert ranked(index, "count rows") == [("db", "describe")]  # "rows" → table
    terms = {t.token: t for t in index.query_terms("count rows")}
    assert terms["table"].origin == "related: rows" and terms["table"].weight < DEFAULT_PARAMS.expansion_absent
    matches = index.explain("count rows", "db", "describe")
    assert [(m.query_term, m.origin) for m in matches] == [("table", "related: rows")]
    present = {t.token for t in index.query_terms("describe the table")}
    assert not [t for t in index.query_terms("describe the table") if t.origin.startswith("related")], present


def test_names_in_a_request_lend_no_lexicon_words() -> None:
    """ "Del" in "Lana Del Rey" is a name, not "delete"; "del" written as a command still is."""
    query = "play songs by Lana Del Rey"
    assert names(query) == {"lana", "del", "rey"}
    named = {t.token: t for t in query_terms(tokenize(query), 0.1, 0.3, names=names(query))}
    assert not named.keys() & {"delete", "remove", "erase"}
    assert named["del"].weight == 1.0 and not named["del"].partial  # whole words only: not "delete" either
    command = {t.token for t in query_terms(tokenize("del old files"), 0.1, 0.3, names=names("del old files"))}
    assert "delete" in command
    assert names("Show me a picture. Delete it") == set()  # first words of sentences
    assert names("Find Hotels In Paris") == set()  # every word capitalised: a title, not names
    assert names("convert PDF to text") == set()  # an acronym is not a name
    assert names("") == set() and names(None) == set()


def test_the_related_terms_table_is_compact_and_one_neighbour_per_meaning() -> None:
    """Entries parse from the file's compact strings; a neighbour is never the word's own stem, nor
    the stem of a nearer neighbour; a shorter word the query word starts with is kept (the prefix
    tier only reaches longer ones)."""
    table = related_terms()
    assert len(table) > 30_000 and table.get("no-such-word") == ()
    lawyer = table["lawyer"]
    assert "law" in dict(lawyer)  # "lawyer" never prefix-matches "law"
    for word in ("lawyer", "schedule", "picture", "rows"):
        stems = [stem(term) for term, _ in table[word]]
        assert stem(word) not in stems and len(stems) == len(set(stems)), (word, table[word])
        sims = [sim for _, sim in table[word]]
        assert sims == sorted(sims, reverse=True) and all(0.5 <= sim <= 1 for sim in sims)


def test_a_lexicon_word_lends_only_the_lexicon_words() -> None:
    """An embedding model's neighbours of "save" include "delete": a word the lexicon knows (tool
    vocabulary) lends its hand-chosen expansions only, even where the catalog lacks it."""
    assert "delete" in dict(related_terms()["save"])  # what the table would have lent
    catalog = synthetic(
        "notes",
        {"name": "write_note", "description": "Write a note to disk."},
        {"name": "delete_note", "description": "Delete a note."},
    )
    index, _ = build([catalog])
    assert not [t for t in index.query_terms("save my note") if t.origin.startswith("related")]
    assert ranked(index, "save my note")[0] == ("notes", "write_note")


def test_a_word_inside_another_word_is_not_held_by_the_catalog() -> None:
    """ "put" is inside "input", but no tool says "put": it lends its lexicon words at the weight
    for a word the catalog does not hold, so the tool that inserts rows wins."""
    terms, first = terms_and_first(
        "put a row",
        {"name": "write_query", "description": "Run an INSERT or UPDATE statement."},
        {"name": "create_table", "description": "Create a new table from the input rows."},
    )
    assert terms["insert"].origin == "lexicon: put" and terms["insert"].weight == DEFAULT_PARAMS.expansion_absent
    assert first == "write_query"


def test_a_verb_and_its_particle_mean_what_the_verb_alone_does_not() -> None:
    """ "add up" is sum, not create: a two-word lexicon entry matches consecutive query words (by stem)
    and its words replace the verb's own; the particle stays a stop word, and apart it means nothing."""
    tools = (
        {"name": "new_entry", "description": "Create an entry in the list."},
        {"name": "calculator", "description": "Returns the total of two numbers."},
    )
    terms, first = terms_and_first("add up the prices", *tools)
    assert first == "calculator"
    assert terms["total"].origin == "lexicon: add up" and terms["total"].weight == DEFAULT_PARAMS.expansion_absent
    assert not terms.keys() & {"create", "new"} and terms["up"].origin == "stop word"
    assert terms_and_first("adding up the numbers", *tools)[0]["sum"].origin == "lexicon: adding up"
    apart, _ = terms_and_first("add the prices up", *tools)
    assert {"create", "new"} <= apart.keys() and apart["total"].origin == "lexicon: add"
    assert "up" in lexicon().stop_words and ("add", "up") in lexicon().phrases
    take_back = {t.token: t for t in query_terms(tokenize("take back the last change"), 0.1, 0.3, 0.7)}
    assert take_back["undo"].origin == "lexicon: take back" and take_back["undo"].weight == 0.7  # "take": a stop word


def test_a_phrase_that_lists_its_verb_keeps_the_verbs_own_words() -> None:
    """ "note down" means what "note" does (its entry lists "note"): the request still searches
    note's own words ("fact", "observation") besides the phrase's; "add up" does not list "add",
    so it searches "sum", never add's "create"."""
    noted = {t.token: t for t in query_terms(tokenize("note down that the password rotates"), 0.1, 0.3, 0.7)}
    assert noted["save"].origin == "lexicon: note down" and noted["fact"].origin == "lexicon: note"
    added = {t.token: t for t in query_terms(tokenize("add up the prices"), 0.1, 0.3, 0.7)}
    assert "sum" in added and "create" not in added
    written = {t.token: t for t in query_terms(tokenize("write down my list"), 0.1, 0.3, 0.7)}
    assert {"save", "persist", "store"} <= written.keys()


FILE_TOOLS = (
    {"name": "open_nodes", "description": "Open nodes of the knowledge graph by their names."},
    {"name": "read_text_file", "description": "Read the contents of a text file."},
    {"name": "read_media_file", "description": "Read an image or audio file as base64."},
)
WEB_TOOLS = (
    {"name": "fetch", "description": "Fetches a URL from the internet and extracts its contents."},
    {"name": "create_entities", "description": "Create multiple new entities in the knowledge graph."},
    {"name": "send_email", "description": "Send an email message to a recipient."},
)


@pytest.mark.parametrize(
    ("query", "tools", "first", "lent"),
    [
        ("open notes.txt", FILE_TOOLS, "read_text_file", {"file": "notes_txt", "text": "notes_txt"}),
        ("look at Desktop/chart_2024.png", FILE_TOOLS, "read_media_file", {"image": "chart_2024_png"}),
        ("what's new on python.org", WEB_TOOLS, "fetch", {"url": "python_org", "web": "python_org"}),
    ],
)
def test_a_file_or_host_name_lends_what_it_stands_for(
    query: str, tools: tuple[dict[str, str], ...], first: str, lent: dict[str, str]
) -> None:
    """ "open notes.txt" never says "file", "what's new on python.org" never says "web": a word
    written as a name and a file extension lends "file" and the kind of file ("txt": text, "png":
    image); one written as a name and a top-level domain, a host name, lends what "https" lends
    (url, web). Both as lexicon words of the written word, at the weight of those of a word no
    tool holds, so the tool that reads the file or fetches the page comes first."""
    terms, found = terms_and_first(query, *tools)
    assert found == first
    for token, word in lent.items():
        assert terms[token].origin == f"lexicon: {word}", token
        assert terms[token].weight == DEFAULT_PARAMS.expansion_absent


def test_what_a_dotted_word_does_not_lend() -> None:
    """An identifier without a dot, an email address's domain and a last part that is neither an
    extension nor a domain lend nothing; a URL with its scheme lends through "https", as before."""
    index, _ = build([synthetic("s", *FILE_TOOLS, *WEB_TOOLS)])
    for query in ("open the git_log output", "email jenny@park.io", "e.g. the nodes", "release v1.final"):
        assert not [t for t in index.query_terms(query) if t.token in ("file", "text", "url", "web")], query
    lent = {t.token: t for t in index.query_terms("read https://example.com")}
    assert lent["url"].origin == lent["web"].origin == "lexicon: https"
    assert lexicon().dotted_word_words("gz") == ("file", "archive") and lexicon().dotted_word_words("final") == ()
    assert set(lexicon().dotted_word_words("com")) == set(lexicon().expansions[stem("https")]) == {"url", "web"}


@pytest.mark.parametrize(
    ("text", "dotted"),
    [
        ("open notes.txt", {"notes_txt": "txt"}),
        ("How large is backup.tar.gz?", {"backup_tar_gz": "gz"}),
        ("compare config/dev.yaml and config/prod.YAML", {"dev_yaml": "yaml", "prod_yaml": "yaml"}),
        ("mail jenny@park.io", {}),
        ("what's on nytimes.com", {"nytimes_com": "com"}),
        ("read https://example.com/a/page.html", {"page_html": "html"}),
        ("git_log and read-file", {}),
        ("end of sentence. Next one", {}),
        ("", {}),
    ],
)
def test_dotted_words_are_the_words_written_with_a_last_part_after_a_dot(text: str, dotted: dict[str, str]) -> None:
    assert dotted_words(text) == dotted


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=80))
def test_dotted_words_are_identifier_tokens_of_the_text_for_any_text(text: str) -> None:
    found = dotted_words(text)
    assert set(found) <= set(identifiers(text))
    assert all(part == part.lower() and part for part in found.values())


def test_a_name_lends_its_related_words_but_no_lexicon_words() -> None:
    """ "Bitcoin" is a name (capitalised mid-sentence): it lends what it is (cryptocurrency), at the
    related words' weight; a short name ("Del") lends nothing."""
    terms, first = terms_and_first(
        "what is Bitcoin worth",
        {"name": "crypto_prices", "description": "Prices of cryptocurrencies."},
        {"name": "weather", "description": "The forecast for a city."},
    )
    assert terms["bitcoin"].origin == "name" and terms["cryptocurrency"].origin == "related: bitcoin"
    assert terms["cryptocurrency"].weight < DEFAULT_PARAMS.expansion_absent
    assert first == "crypto_prices"
    short, _ = terms_and_first("songs by Lana Del Rey", {"name": "play", "description": "Play songs."})
    assert not [t for t in short.values() if t.origin in ("related: del", "related: rey")]


def test_a_word_few_tools_hold_lends_its_related_words() -> None:
    """A query word that at most `rare_holders` tools hold lends its related words at `related_rare`
    ("scientific" in a calculator's description says little of "scientific literature"); a word
    more tools hold lends none."""
    calculator = {"name": "calculator", "description": "A scientific calculator."}
    papers = {"name": "papers", "description": "Search academic research papers and studies."}
    params = replace(WORDS, related_rare=0.3, rare_holders=1)
    query = "scientific literature"
    index = _with(params, synthetic("s", calculator, papers))
    terms = {t.token: t for t in index.query_terms(query)}
    assert terms["studies"].origin == "related: scientific"
    assert terms["studies"].weight == pytest.approx(0.3 * dict(related_terms()["scientific"])["studies"])
    assert ("s", "papers") in ranked(index, query)
    both = _with(params, synthetic("s", calculator, papers, {"name": "lab", "description": "Scientific units."}))
    assert not [t for t in both.query_terms(query) if t.origin == "related: scientific"]
    plain = _with(replace(params, related_rare=0.0), synthetic("s", calculator, papers))
    assert not [t for t in plain.query_terms(query) if t.origin == "related: scientific"]


def test_a_word_common_in_english_weighs_less() -> None:
    """A catalog's idf cannot tell that "near" or "find" is rarely what a request is about: the
    shipped table of English word frequencies weighs them down, never below the floor; rare and
    unknown words, numbers and stop words keep their weight."""
    assert common_words()["find"] > 5.5 > common_words()["apartments"]
    commonness = Commonness(slope=0.4, pivot=4.9, floor=0.5)
    assert commonness.weight("apartments") == commonness.weight("zzqqxxv") == 1.0
    assert 0.5 <= commonness.weight("near") < 1.0 and commonness.weight("find") < commonness.weight("near")
    assert Commonness(slope=0.0).weight("find") == 1.0
    tools = (
        {"name": "places", "description": "Find places on a map."},
        {"name": "rentals", "description": "Apartments to rent by month."},
    )
    terms, first = terms_and_first("find apartments near the station", *tools)
    assert terms["find"].weight < terms["near"].weight < terms["apartments"].weight == 1.0
    assert terms["the"].weight == DEFAULT_PARAMS.stop_word
    assert first == "rentals"
    flat = ToolSearchIndex(replace(WORDS, common_slope=0.0, related_rare=0.0))  # the words alone
    store = CatalogStore()
    flat.attach(store)
    store.put(synthetic("s", *tools))
    assert ranked(flat, "find apartments near the station")[0] == ("s", "places")  # a tie without it


@settings(max_examples=60, deadline=None)
@given(
    text=st.text(max_size=80),
    slope=st.floats(0.0, 2.0),
    pivot=st.floats(3.0, 7.0),
    floor=st.floats(0.05, 1.0),
)
def test_query_term_weights_stay_in_bounds_for_any_text(text: str, slope: float, pivot: float, floor: float) -> None:
    """Whatever the request and the commonness curve: every term weighs more than 0 and at most 1,
    a query word no less than the floor, and the same text gives the same terms."""
    commonness = Commonness(slope, pivot, floor)
    terms = query_terms(tokenize(text), 0.2, 0.2, 0.7, None, names(text), 0.0, 0.7, 0.4, commonness)
    assert terms == query_terms(tokenize(text), 0.2, 0.2, 0.7, None, names(text), 0.0, 0.7, 0.4, commonness)
    assert all(0 < t.weight <= 1 for t in terms)
    assert all(t.weight >= min(floor, 0.7) for t in terms if t.origin in ("query", "name"))
    words = sorted(common_words(), key=lambda w: (common_words()[w], w))[::500]
    weights = [commonness.weight(w) for w in words]
    assert weights == sorted(weights, reverse=True)  # the more common, the lighter


def _with(params: RankingParams, *catalogs: Catalog) -> ToolSearchIndex:
    index = ToolSearchIndex(params)
    store = CatalogStore()
    index.attach(store)
    for catalog in catalogs:
        store.put(catalog)
    return index


def test_a_tool_that_covers_more_of_the_request_outranks_one_word_lifts() -> None:
    """Coverage: a score is the tool's summed evidence times the share of the request's word weight
    it matches, to the power `coverage`. One rare word ("zodiac") no longer outweighs two others
    ("rain", "tomorrow") a tool holds; a tool matching only function words keeps LEAST_FACTOR."""
    catalog = synthetic(
        "s",
        {"name": "zodiac", "description": "Zodiac signs."},
        {
            "name": "forecast",
            "description": "Weather forecast for a city, with rain and wind, for today and tomorrow and every "
            "day after, hour by hour, in any unit you like.",
        },
        {"name": "note", "description": "Keep a note about the cats."},
    )
    alone = replace(WORDS, related_rare=0.0)  # "zodiac", held by one tool, lends no words here
    plain = _with(replace(alone, coverage=0.0), catalog)
    index = _with(alone, catalog)
    query = "rain tomorrow zodiac"
    assert ranked(plain, query)[:2] == [("s", "zodiac"), ("s", "forecast")]  # the summed evidence alone
    assert ranked(index, query)[:2] == [("s", "forecast"), ("s", "zodiac")]
    weight = {t.token: t.weight for t in index.query_terms(query)}
    share = (weight["rain"] + weight["tomorrow"]) / (weight["rain"] + weight["tomorrow"] + weight["zodiac"])
    before, after = (next(h.score for h in i.search(query, 5) if h.tool == "forecast") for i in (plain, index))
    assert after == pytest.approx(before * share**alone.coverage)
    assert sum(m.contribution for m in index.explain(query, "s", "forecast")) == pytest.approx(after)
    factor = share**alone.coverage
    assert [m.coverage for m in index.explain(query, "s", "forecast")] == [pytest.approx(factor)] * 2
    shown = format_explanation(index, query, {"results": [{"server": "s", "tool": "forecast", "score": after}]})
    assert f"(coverage ×{factor:.3f})" in shown.splitlines()[1]
    stop_only = "the zodiac"  # "note" matches "the" only
    before, after = (next(h.score for h in i.search(stop_only, 5) if h.tool == "note") for i in (plain, index))
    assert after == pytest.approx(before * LEAST_FACTOR) and after > 0


_FORECAST_WORDS = ["rain", "tomorrow", "zodiac", "the", "a", "city", "wind", "cats", "7"]


@settings(max_examples=60, deadline=None)
@given(
    words=st.lists(st.sampled_from(_FORECAST_WORDS), max_size=6),
    coverage=st.floats(0.0, 1.0),
)
def test_coverage_never_raises_a_score_and_explain_adds_up(words: list[str], coverage: float) -> None:
    catalog = synthetic(
        "s",
        {"name": "zodiac", "description": "Zodiac signs for the 7 days."},
        {"name": "forecast", "description": "Rain and wind in a city, today and tomorrow."},
        {"name": "note", "description": "Keep a note about the cats."},
    )
    plain = _with(replace(WORDS, coverage=0.0), catalog)
    index = _with(replace(WORDS, coverage=coverage), catalog)
    query = " ".join(words)
    before = plain.all_scores(query)
    after = index.all_scores(query)
    assert after.keys() == before.keys()
    assert all(0 < after[key] <= before[key] * (1 + 1e-12) for key in after)
    assert ranked(index, query) == [key for key, _ in sorted(after.items(), key=lambda kv: (-kv[1], kv[0]))]
    for (server, tool), score in after.items():
        assert sum(m.contribution for m in index.explain(query, server, tool)) == pytest.approx(score)


def test_lexicon_expansion_never_outweighs_the_literal_word() -> None:
    terms = {t.token: t for t in query_terms(tokenize("ls image list"), 0.1, 0.3)}
    assert terms["list"].weight == 1.0  # the query's own word, though "ls" also adds it
    assert terms["image"].weight == 1.0 and terms["photo"].weight == 0.3


def test_a_query_word_and_its_lexicon_words_score_as_one_group() -> None:
    """dis_max: the best of "find" and the words it adds counts in full, the others at `lexicon_tie`."""
    catalog = synthetic(
        "s",
        {"name": "lookup", "description": "Search, query or seek anything."},
        {"name": "locate", "description": "Find it."},
        {"name": "other", "description": "Something else."},
    )

    def scores(tie: float) -> tuple[float, list[float]]:
        index = ToolSearchIndex(replace(WORDS, lexicon_tie=tie))
        store = CatalogStore()
        index.attach(store)
        store.put(catalog)
        score = next(h.score for h in index.search("find", 5) if h.tool == "lookup")
        return score, [m.contribution for m in index.explain("find", "s", "lookup")]

    as_sum, values = scores(1.0)
    assert len(values) == 4 and as_sum == pytest.approx(sum(values))  # lookup, search, query, seek
    assert scores(0.0)[0] == pytest.approx(max(values))
    tie = DEFAULT_PARAMS.lexicon_tie
    score, shares = scores(tie)
    assert score == pytest.approx(max(values) + tie * (sum(values) - max(values))) == pytest.approx(sum(shares))
    index, _ = build([catalog])
    assert ranked(index, "find")[0] == ("s", "locate")  # the literal word beats any number of synonyms


def test_annotation_hints_are_single_tokens() -> None:
    tokens = annotation_tokens({"readOnlyHint": True, "destructiveHint": False, "title": "Read File"})
    assert tokens == ["readonly", "read", "file"]


# ---------------------------------------------------------------- ranking rules


TIERS = synthetic(
    "tiers",
    {"name": "search", "description": "Look things up."},
    {"name": "searcher_tool", "description": "Another tool."},
    {"name": "research_tool", "description": "A third tool."},
    {"name": "unrelated", "description": "Nothing to see."},
)


@pytest.mark.parametrize(
    ("a", "b"),
    [("commit", "commits"), ("stage", "staging"), ("staged", "staging"), ("entry", "entries"), ("stop", "stopped")],
)
def test_inflections_of_a_word_are_told_from_derived_words(a: str, b: str) -> None:
    assert stem(a) == stem(b) and inflection_pair(a, b) and inflection_pair(b, a)


@pytest.mark.parametrize(("a", "b"), [("commit", "commitment"), ("design", "designation"), ("effect", "effective")])
def test_derived_words_of_one_stem_are_not_inflections(a: str, b: str) -> None:
    assert stem(a) == stem(b) and not inflection_pair(a, b) and not inflection_pair(b, a)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=12), st.text(max_size=12))
def test_inflection_pairs_are_symmetric_for_any_text(a: str, b: str) -> None:
    assert inflection_pair(a, b) == inflection_pair(b, a)
    assert inflection_pair(a, a)


def test_a_derived_word_counts_less_than_an_inflection() -> None:
    """Sense-safe stemming: "commitment" shares the stem of "commit" but rarely its sense."""
    pledge = {"name": "pledge", "description": "Record a commitment to a goal."}
    index, _ = build([synthetic("s", pledge, {"name": "history", "description": "Show the commits of a repo."})])
    assert ranked(index, "commit") == [("s", "history"), ("s", "pledge")]
    assert {m.term: m.tier for m in index.explain("commit", "s", "pledge")} == {"commitment": "stem"}


def test_exact_above_prefix_above_substring() -> None:
    index, _ = build([TIERS])
    hits = index.search("search", 10)
    assert [h.tool for h in hits] == ["search", "searcher_tool", "research_tool"]
    assert hits[0].score > hits[1].score > hits[2].score


def test_short_tokens_match_only_exactly() -> None:
    index, _ = build([synthetic("s", {"name": "get_value"}, {"name": "budget"}, {"name": "ge"})])
    assert ranked(index, "ge") == [("s", "ge")]


def test_tool_name_match_above_description_only_match() -> None:
    catalog = synthetic(
        "s",
        {"name": "archive", "description": "Packs files."},
        {"name": "pack_files", "description": "Puts files in an archive."},
    )
    index, _ = build([catalog])
    assert ranked(index, "archive") == [("s", "archive"), ("s", "pack_files")]


def test_rare_exact_match_beats_common_words() -> None:
    common = [{"name": f"tool_{i}", "description": "Read the file and return the file contents."} for i in range(30)]
    rare = {"name": "shift_clock", "description": "Shift a timestamp into another timezone."}
    index, _ = build([synthetic("s", *common, rare)])
    assert ranked(index, "read the file in my timezone")[0] == ("s", "shift_clock")


def test_ties_break_on_server_then_tool() -> None:
    twin = {"name": "ping", "description": "Ping."}
    index, _ = build([synthetic("b", twin), synthetic("a", twin, {"name": "ping2", "description": "Ping."})])
    hits = index.search("ping", 10)
    assert [(h.server, h.tool) for h in hits[:2]] == [("a", "ping"), ("b", "ping")]
    assert hits[0].score == hits[1].score


def test_cjk_descriptions_are_searchable() -> None:
    catalog = synthetic(
        "bing-cn",
        {"name": "bing_search", "description": "使用必应搜索指定的关键词，并返回搜索结果列表"},
        {"name": "fetch_webpage", "description": "根据提供的ID获取对应网页的内容"},
    )
    index, _ = build([catalog])
    assert ranked(index, "搜索关键词") == [("bing-cn", "bing_search")]
    assert ranked(index, "网页")[0] == ("bing-cn", "fetch_webpage")
    assert ranked(index, "搜")[0] == ("bing-cn", "bing_search")  # one character prefix-matches a bigram


def test_fields_searched_include_args_annotations_title_and_metadata() -> None:
    catalog = synthetic(
        "weather",
        {"name": "lookup", "inputSchema": {"type": "object", "properties": {"postalCode": {"type": "string"}}}},
        {"name": "wipe", "annotations": {"destructiveHint": True}},
        {"name": "t1", "title": "Barometer Reading"},
    )
    index, _ = build([catalog], {"weather": ("Forecasts from the met office", ["meteorology"])})
    assert ranked(index, "postal code") == [("weather", "lookup")]
    assert ranked(index, "destructive") == [("weather", "wipe")]
    assert ranked(index, "barometer") == [("weather", "t1")]
    assert {t for _, t in ranked(index, "meteorology")} == {"lookup", "wipe", "t1"}


def test_hidden_tools_are_not_searchable() -> None:
    catalog = synthetic("s", {"name": "delete_all"}, {"name": "delete_one"}, hidden=["delete_all"])
    index, _ = build([catalog])
    assert ranked(index, "delete") == [("s", "delete_one")]


_TABLE_WORDS = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=12)


_ENTRIES = st.lists(
    st.tuples(st.text(st.characters(blacklist_categories=("Cs", "Z", "Cc")), min_size=1), st.floats(0, 1)),
    max_size=4,
).map(lambda pairs: " ".join(f"{word} {similarity:.2f}" for word, similarity in pairs))  # as the file writes them


@given(related=st.dictionaries(_TABLE_WORDS, _ENTRIES, max_size=8), absent=_TABLE_WORDS)
def test_related_table_blob_finds_every_entry_and_nothing_else(related: dict[str, str], absent: str) -> None:
    """The table is kept as one sorted blob searched by bisection (issue 24: memory): every word
    finds its own entry, whatever its characters, and a word not in it finds nothing."""
    related = {word: entry for word, entry in related.items() if not {"\t", "\n"} & set(word + entry)}
    table = RelatedTerms(related)
    assert len(table) == len(related)
    assert sorted(table.words()) == sorted(related)
    assert all(table.get(word) == table[word] == _parse_related(entry) for word, entry in related.items())
    if absent not in related:
        assert table.get(absent) == ()
        with pytest.raises(KeyError):
            table[absent]


def test_related_table_shipped_file_is_whole() -> None:
    import gzip
    from importlib import resources

    text = gzip.decompress(resources.files("aggregator.catalog").joinpath("data/related_terms.json.gz").read_bytes())
    raw = json.loads(text)["related"]
    table = related_terms()
    assert len(table) == len(raw) > 30_000
    sample = list(raw)[:: len(raw) // 500]
    assert all(table.get(word) == table[word] == _parse_related(raw[word]) for word in sample)
    assert table.get("not-a-word-at-all") == ()


def test_a_server_field_that_only_repeats_its_tool_counts_once() -> None:
    """A one-tool server named and described as its tool: the repeated words are one piece of
    evidence, so the tool weighs as it would with no server metadata; a server that says more counts."""
    tool = {"name": "weather", "description": "Forecasts for any city"}
    others = [synthetic("news", {"name": "headlines", "description": "News of any city"})]
    bare, _ = build([synthetic("weather", tool), *others])
    echoed, _ = build([synthetic("weather", tool), *others], {"weather": ("Forecasts for any city", [])})
    richer, _ = build([synthetic("weather", tool), *others], {"weather": ("Forecasts and radar", [])})
    for query in ("weather forecasts", "city"):
        score = bare.all_scores(query)["weather", "weather"]
        assert echoed.all_scores(query)["weather", "weather"] == pytest.approx(score)
        assert sum(m.contribution for m in echoed.explain(query, "weather", "weather")) == pytest.approx(score)
    assert richer.all_scores("radar")["weather", "weather"] > 0
    assert richer.all_scores("forecasts")["weather", "weather"] > bare.all_scores("forecasts")["weather", "weather"]
    echoed_fields = {m.term: m.fields for m in echoed.explain("weather forecasts", "weather", "weather")}
    assert echoed_fields == {"weather": ("name",), "forecasts": ("description",)}  # explain names what counted


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.booleans(), st.sampled_from(["convert", "converts", "converted", "time", "timer", "zone"])),
        max_size=30,
    ),
    st.integers(min_value=0, max_value=30),
)
def test_the_vocabulary_made_lazily_matches_one_kept_up_to_date(ops: list[tuple[bool, str]], first_lookup: int) -> None:
    """The stem table is made at the first lookup (PyStemmer stays out of a `serve` that never searches):
    adds and removes before and after it give the tiers a table kept up to date from the start gives."""
    from aggregator.catalog.search.vocabulary import Vocabulary

    lazy, eager = Vocabulary(DEFAULT_PARAMS), Vocabulary(DEFAULT_PARAMS)
    eager.expand("warm", True)  # its stem table exists from here on
    held: set[str] = set()
    for step, (adding, term) in enumerate(ops):
        if step == first_lookup:
            lazy.expand("warm", True)
        if adding and term not in held:
            held.add(term)
            lazy.add(term), eager.add(term)
        elif not adding and term in held:
            held.discard(term)
            lazy.remove(term), eager.remove(term)
        lazy.forget(), eager.forget()
    for token in ("convert", "time", "zone", "converting", "tim"):
        assert lazy.expand(token, True) == eager.expand(token, True)


NAME_VERB_TOOLS = (
    {"name": "create_table", "description": "Create a new table."},
    {"name": "delete_entities", "description": "Delete entities from the graph."},
    {"name": "run_statement", "description": "Run a statement that may delete data."},
)


def test_a_name_object_counts_less_when_the_request_opens_with_another_name_verb() -> None:
    """ "delete ... table" opens with a verb that opens a tool's name (delete_entities): "table"
    then says little for `create_table`, whose verb the request does not ask for; so for a question
    ("what ..."). A request that asks for create (or a verb of its kind: write), or opens with
    no verb, leaves the name its full weight."""
    plain = replace(WORDS, name_damping=1.0)
    query = "delete the old rows from the events table"
    index, _ = build([synthetic("db", *NAME_VERB_TOOLS)])
    undamped = ToolSearchIndex(plain)
    undamped.load_catalog(synthetic("db", *NAME_VERB_TOOLS))
    assert ranked(undamped, query)[0] == ("db", "create_table")
    assert ranked(index, query)[0] != ("db", "create_table")
    damped = (query, "drop the old rows from the events table", "what rows are in the events table")
    for opening in damped:  # "drop" lends related words; a question reads
        [table] = [m for m in index.explain(opening, "db", "create_table") if m.query_term == "table"]
        [full] = [m for m in undamped.explain(opening, "db", "create_table") if m.query_term == "table"]
        assert table.contribution == pytest.approx(full.contribution * DEFAULT_PARAMS.name_damping), opening
    for kept in ("create a table for the events", "the events table", "add up the table", "write the events table"):
        assert index.all_scores(kept) == undamped.all_scores(kept), kept


@settings(max_examples=40, deadline=None)
@given(st.lists(st.sampled_from(["delete", "create", "table", "rows", "run", "entities", "the", "up"]), max_size=6))
def test_name_damping_never_raises_a_score_and_search_agrees(words: list[str]) -> None:
    query = " ".join(words)
    index, _ = build([synthetic("db", *NAME_VERB_TOOLS)])
    undamped = ToolSearchIndex(replace(WORDS, name_damping=1.0))
    undamped.load_catalog(synthetic("db", *NAME_VERB_TOOLS))
    scores, full = index.all_scores(query), undamped.all_scores(query)
    assert all(score <= full[key] + 1e-12 for key, score in scores.items())
    best = sorted(scores.items(), key=lambda item: (-item[1], item[0]))[:2]
    assert [(h.server, h.tool) for h in index.search(query, 2)] == [key for key, _ in best]
    for (server, tool), score in scores.items():
        assert sum(m.contribution for m in index.explain(query, server, tool)) == pytest.approx(score)


def test_names_loaded_and_replaced_before_any_search_are_parsed_at_the_first_one() -> None:
    """A name's verb and object are worked out at the first search, not at load (stemming loads
    the stemmer, which `serve` defers): a catalog replaced and one dropped before any search leave
    nothing behind, and the damping then holds for what is loaded, as on a fresh index."""
    index = ToolSearchIndex(WORDS)
    index.load_catalog(synthetic("db", *NAME_VERB_TOOLS))
    index.load_catalog(synthetic("old", {"name": "create_index", "description": "Create an index on a table."}))
    index.load_catalog(synthetic("db", *NAME_VERB_TOOLS[:2]))  # replaces db: run_statement goes
    index.drop_catalog("old")
    fresh, _ = build([synthetic("db", *NAME_VERB_TOOLS[:2])])
    query = "delete the old rows from the events table"
    assert index.all_scores(query) == fresh.all_scores(query)
    assert index.explain(query, "db", "create_table") == fresh.explain(query, "db", "create_table")
    index.drop_catalog("db")  # after the first search: the parsed names go too
    assert index.search(query, 5) == [] and index.all_scores("create table") == {}
    assert not (index._name_parts or index._by_object or index._verbs or index._unparsed_names)  # nothing leaks
