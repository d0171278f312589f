"""Query vocabulary of the tool search: stop words and the tool lexicon (DESIGN §2.2).

A query's tokens each get a weight: 1 for a word of the query, less for a
function word ("the", "of", "with": the `stop-words` package's English list), and
less again for a word the lexicon adds (`data/lexicon.json`: "picture" also
searches "image" and "photo", "ls" also "list directory"). A word the lexicon
knows is tool vocabulary and never a stop word, whatever the stop list says
("show", "open", "copy", "move" are on it).

Lexicon words are matched by Snowball stem, so "pictures" expands like
"picture". The lexicon file is read once, on first use.

A two-word entry ("add up", "look up", "take back": a verb and its particle,
a stop word, as the verb may be) matches two consecutive query words by stem
and adds its words in place of the verb's own: "add up 3 and 4" searches "sum" and "total", not the
"create" and "new" of "add". A phrase whose words include its verb keeps the verb's sense, and so
its words too: "note down" (save, record, note) still searches note's "fact" and "observation".
No catalog holds a phrase as such, so its words weigh what a lexicon word of an absent query word
weighs.

A file name ("notes.txt", "backup.tar.gz") lends "file" and the kind of file its
extension names (`file_extensions` in the lexicon file: text, image, audio...),
as lexicon words of it: a request that names a file rarely says "file". A host
name written without its scheme ("nytimes.com", `top_level_domains`) lends what
"https" lends (url, web): a request that names a site rarely says "web page".

The words a query word adds are alternatives to it, not more evidence: the
ranking takes the best of a word and its additions in full and the rest at a
small share (`RankingParams.lexicon_tie`), so a tool that says "search",
"find" and "query" does not outscore one that says "search" once for the query
"find".

A query word that the catalog does not hold at all and that the lexicon does
not know (its words are tool vocabulary, with hand-chosen expansions: an
embedding model's neighbours of "save" include "delete") lends its related words
(`data/related_terms.json.gz`, distilled offline from a sentence-embedding model by
`benchmarks/build_related_terms.py`): "rows" searches "table" and "column", at
`RankingParams.related_absent` × their similarity, below the lexicon's words.
A word written as a name ("Del" in "Lana Del Rey") lends no lexicon words and
matches whole words only; one of four letters or more lends its related words
("Bitcoin": cryptocurrency, blockchain), a shorter one ("Del", "Rey") nothing;
a number counts less than a word (`RankingParams.number`), and a word the
more common it is in English at large (`data/common_words.json`, from the
wordfreq word list; `RankingParams.common_slope`), since a catalog's own
statistics cannot tell that "near" or "find" is rarely what a request is about.

Only a word of the query itself may match longer words (the prefix and
substring tiers): a function word or a lexicon word matches whole words and
their stems, so "the" never finds "their" nor the lexicon's "dir" "directly".
An identifier the query writes (`get_file`) is searched whole, besides its parts.
"""

from __future__ import annotations

import gzip
import json
from array import array
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from importlib import resources
from itertools import pairwise

from stop_words import get_stop_words

from aggregator.catalog.search.tokens import is_identifier, stem, tokenize
from aggregator.heap import release_freed_memory

LITERAL = "query"
STOP = "stop word"
NAME = "name"  # a word the query writes as a name: matched whole, lends no lexicon words
MIN_NAME_RELATED = 4  # a shorter name ("Del", "Rey") is a particle or an initialism: it lends nothing


@dataclass(frozen=True, slots=True)
class QueryTerm:
    """One distinct token the query searches, its weight, and where it came from."""

    token: str
    weight: float
    origin: str  # LITERAL, STOP, NAME, "lexicon: <query word>" or "related: <query word>"
    word: str  # the query word it stands for: itself, or the word whose lexicon entry added it

    @property
    def partial(self) -> bool:
        """Whether the token may match longer words (prefix, substring tiers)."""
        return self.origin == LITERAL and not is_identifier(self.token)


Related = tuple[tuple[str, float], ...]  # related words of a word, each with its similarity


class RelatedTerms:
    """The table of related words: word → ((word, similarity), ...).

    Kept as one UTF-8 blob of `word<TAB>entry` lines sorted by word, each entry the compact string
    of the file ("attorneys 0.91 law 0.70"), found by binary search over the lines' offsets and
    parsed when looked up. As a dict of 37,000 strings the table held 10 MB of RSS from a
    session's first search on (issue 24: memory); as the blob about 3.
    """

    def __init__(self, raw: Mapping[str, str]) -> None:
        blob = bytearray()
        self._offsets = array("I")
        for word, entry in sorted((w.encode(), e.encode()) for w, e in raw.items()):
            self._offsets.append(len(blob))
            blob += b"%s\t%s\n" % (word, entry)
        self._blob = bytes(blob)

    def __len__(self) -> int:
        return len(self._offsets)

    def __getitem__(self, word: str) -> Related:
        entry = self._entry(word)
        if entry is None:
            raise KeyError(word)
        return _parse_related(entry)

    def get(self, word: str, default: Related = ()) -> Related:
        entry = self._entry(word)
        return default if entry is None else _parse_related(entry)

    def words(self) -> list[str]:
        """Every word of the table, in byte order."""
        blob = self._blob
        return [blob[at : blob.index(b"\t", at)].decode() for at in self._offsets]

    def _entry(self, word: str) -> str | None:
        key = word.encode("utf-8", "surrogatepass")  # a lone surrogate matches nothing, never raises
        blob, offsets = self._blob, self._offsets
        low, high = 0, len(offsets)
        while low < high:
            middle = (low + high) // 2
            start = offsets[middle]
            tab = blob.index(b"\t", start)
            found = blob[start:tab]
            if found < key:
                low = middle + 1
            elif found > key:
                high = middle
            else:
                return blob[tab + 1 : blob.index(b"\n", tab)].decode()
        return None


@lru_cache(maxsize=4096)
def _parse_related(text: str) -> Related:
    parts = text.split()
    return tuple((parts[i], float(parts[i + 1])) for i in range(0, len(parts) - 1, 2))


@cache
def related_terms() -> RelatedTerms:
    """The shipped table of related words (`data/related_terms.json.gz`), loaded once."""
    path = resources.files("aggregator.catalog").joinpath("data/related_terms.json.gz")
    if not path.is_file():
        return RelatedTerms({})
    table = RelatedTerms(json.loads(gzip.decompress(path.read_bytes()))["related"])
    release_freed_memory()  # the decompressed text and its parse: megabytes the C heap would keep
    return table


@cache
def common_words() -> dict[str, float]:
    """The shipped table of how common English words are (`data/common_words.json`: word → Zipf
    frequency, built by `benchmarks/build_common_words.py`), loaded once."""
    path = resources.files("aggregator.catalog").joinpath("data/common_words.json")
    if not path.is_file():
        return {}
    groups = json.loads(path.read_text("utf-8"))["zipf"]
    return {word: float(zipf) for zipf, words in groups.items() for word in words.split()}


@dataclass(frozen=True, slots=True)
class Commonness:
    """How a query word's weight falls with how common it is in English: 1 up to Zipf frequency
    `pivot`, then `slope` less per unit, never below `floor` (`RankingParams.common_*`)."""

    slope: float = 0.0
    pivot: float = 4.5
    floor: float = 0.5

    def weight(self, token: str) -> float:
        zipf = common_words().get(token) if self.slope > 0 else None
        if zipf is None or zipf <= self.pivot:
            return 1.0
        return max(self.floor, 1.0 - self.slope * (zipf - self.pivot))


Phrase = tuple[str, str]  # the stems of two consecutive query words: ("add", "up")


@dataclass(frozen=True, slots=True)
class Lexicon:
    expansions: dict[str, tuple[str, ...]]  # stem of a query word → tokens it adds, sorted
    stop_words: frozenset[str]
    known: frozenset[str]  # stems of every word of the lexicon: tool vocabulary
    phrases: dict[Phrase, tuple[str, ...]]  # a two-word entry ("add up") → tokens it adds, sorted
    extensions: dict[str, str]  # a file name's extension → the kind of file it names ("png": image)
    domains: frozenset[str]  # top-level domains: a host name's last part ("com", "io")

    def dotted_word_words(self, last: str) -> tuple[str, ...]:
        """What a word written as a name, a dot and `last` stands for (`tokens.dotted_words`): a
        file name, "file" and the file's kind ("report.pdf": file, document); a host name, a web
        address, so what "https" lends ("nytimes.com": url, web); else nothing ("v1.final")."""
        if kind := self.extensions.get(last):
            return ("file", kind)
        return self.expansions.get(stem("https"), ()) if last in self.domains else ()

    def phrase_words(self, tokens: list[str]) -> dict[str, tuple[str, tuple[str, ...]]]:
        """Per query word that opens a two-word entry of the lexicon ("add" in "add up the bill"),
        the phrase and the tokens it adds (the first such phrase of the query): a verb and its
        particle ("up", a stop word) mean what the verb alone does not (sum, not create)."""
        out: dict[str, tuple[str, tuple[str, ...]]] = {}
        for first, second in pairwise(tokens):
            added = self.phrases.get((stem(first), stem(second)))
            if added and first not in out:
                out[first] = (f"{first} {second}", added)
        return out


@cache
def lexicon() -> Lexicon:
    """The shipped lexicon and stop list, loaded once."""
    raw = json.loads(resources.files("aggregator.catalog").joinpath("data/lexicon.json").read_text("utf-8"))
    adds: dict[str, set[str]] = {}
    for group in raw["synonyms"]:
        words = [tokenize(word) for word in group]
        for i, word in enumerate(words):
            if len(word) == 1:
                others = {t for j, other in enumerate(words) if j != i for t in other}
                adds.setdefault(stem(word[0]), set()).update(others)
    pairs: dict[Phrase, set[str]] = {}
    for word, phrases in raw["expansions"].items():
        tokens = tokenize(word)
        added = {t for phrase in phrases for t in tokenize(phrase)}
        if len(tokens) == 1:
            adds.setdefault(stem(tokens[0]), set()).update(added)
        elif len(tokens) == 2:
            pairs.setdefault((stem(tokens[0]), stem(tokens[1])), set()).update(added)
    expansions = {key: tuple(sorted(value)) for key, value in adds.items()}
    known = set(expansions) | {stem(t) for value in expansions.values() for t in value}  # not phrases' words
    content = set(raw["content_words"])
    stop = frozenset(w for w in get_stop_words("english") if w.isalpha() and stem(w) not in known and w not in content)
    extensions = {ext: kind for kind, exts in raw["file_extensions"].items() for ext in exts.split()}
    phrase_adds = {key: tuple(sorted(value)) for key, value in pairs.items()}
    domains = frozenset(raw["top_level_domains"].split())
    return Lexicon(expansions, stop, frozenset(known), phrase_adds, extensions, domains)


def query_terms(
    tokens: list[str],
    stop_weight: float,
    expansion_weight: float,
    absent_weight: float | None = None,
    present: Callable[[str], bool] | None = None,
    names: frozenset[str] = frozenset(),
    related_weight: float = 0.0,
    number_weight: float = 1.0,
    related_absent: float | None = None,
    commonness: Commonness = Commonness(),
    rare: Callable[[str], bool] | None = None,
    related_rare: float = 0.0,
    dotted: Mapping[str, str] | None = None,
) -> list[QueryTerm]:
    """The distinct tokens to search for `tokens`, sorted, each with its highest weight.

    If every token of the query is a stop word, they count in full (the query
    "about" still searches for "about"). A query word that the catalog does not
    hold at all (`present` says no) lends its lexicon words `absent_weight`
    instead of `expansion_weight`: they stand in for it ("picture" in a catalog
    that only says "image"). A word in `names` (the query writes it as a name:
    "Del" in "songs by Lana Del Rey") matches whole words only and lends no
    lexicon words: it is not "delete". A word of the query (not a stop word nor
    a number) weighs less the more common it is in English (`commonness`): "find"
    and "near" say less about the tool wanted than "apartment". A name of MIN_NAME_RELATED letters or
    more lends its related words, which stand for what the name is ("Bitcoin":
    cryptocurrency, blockchain). A word that only a few tools hold (`rare` says so)
    lends its related words at `related_rare`: one tool's passing use of "scientific"
    says little of where "scientific literature" is wanted. A file name or a host name
    (`dotted`: its identifier token → the part after its last dot) lends what it stands
    for (`Lexicon.dotted_word_words`: "open notes.txt": file, text; "nytimes.com": url, web)
    as lexicon words of it.
    """
    lex = lexicon()
    literal = {t: (STOP if t in lex.stop_words else NAME if t in names else LITERAL) for t in tokens}
    all_stop = all(origin == STOP for origin in literal.values())
    best: dict[str, QueryTerm] = {}

    def offer(term: QueryTerm) -> None:
        if term.weight > 0 and (term.token not in best or term.weight > best[term.token].weight):
            best[term.token] = term

    phrases = lex.phrase_words(tokens)
    phrase_weight = absent_weight if absent_weight is not None else expansion_weight  # no catalog holds a phrase
    for token, origin in literal.items():
        if origin == STOP:
            weight = 1.0 if all_stop else stop_weight
        else:
            weight = number_weight if token.isdigit() else commonness.weight(token)
        offer(QueryTerm(token, weight, origin, token))
    literal_stems = {stem(t) for t in literal}
    for token, origin in sorted(literal.items()):
        if origin != NAME and token in phrases:  # its phrase's words, not its own ("add up": not create) ...
            phrase, adds = phrases[token]
            for added in adds:
                if stem(added) not in literal_stems and added not in lex.stop_words:
                    offer(QueryTerm(added, phrase_weight, f"lexicon: {phrase}", token))
            if stem(token) not in {stem(added) for added in adds}:
                continue  # ... unless the phrase lists the verb itself: "note down" keeps note's sense
        if origin == STOP or (origin == NAME and len(token) < MIN_NAME_RELATED):
            continue
        weight, related = expansion_weight, related_weight
        if present is not None and not present(token):
            weight = absent_weight if absent_weight is not None else weight
            related = related_absent if related_absent is not None else related
        elif rare is not None and rare(token):
            related = max(related, related_rare)
        adds = lex.expansions.get(stem(token), ()) if origin == LITERAL else ()
        if dotted and token in dotted:
            adds = lex.dotted_word_words(dotted[token])
        for added in adds:
            if stem(added) not in literal_stems and added not in lex.stop_words:
                offer(QueryTerm(added, weight, f"lexicon: {token}", token))
        if related > 0 and stem(token) not in lex.known:  # the lexicon's words have its expansions only
            for added, similarity in related_terms().get(token, ()):
                if stem(added) not in literal_stems and added not in lex.stop_words:
                    offer(QueryTerm(added, related * similarity, f"related: {token}", token))
    return [best[t] for t in sorted(best)]


def coverage_weights(terms: list[QueryTerm]) -> dict[str, float]:
    """Per query word, what it counts towards a tool's coverage of the request (`retrieval.Combine`):
    its own weight, a stop word's 0, whichever of its terms the tool matches. A word whose own
    token went to another word's group (a heavier lexicon term) counts its best remaining term."""
    own = {t.word: 0.0 if t.origin == STOP else t.weight for t in terms if t.token == t.word}
    rest: dict[str, float] = {}
    for term in terms:
        if term.word not in own:
            rest[term.word] = max(rest.get(term.word, 0.0), term.weight)
    return {**rest, **own}
