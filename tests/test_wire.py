"""Line framing of the stdio transports."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from aggregator.wire import LineSplitter, MessageTooLarge


@given(st.lists(st.binary(max_size=40).filter(lambda b: b"\n" not in b), max_size=20), st.data())
def test_any_chunking_gives_the_same_lines(lines: list[bytes], data: st.DataObject) -> None:
    stream = b"".join(line + b"\n" for line in lines)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    splitter = LineSplitter()
    seen: list[bytes] = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        seen += splitter.feed(stream[start:end])
    assert seen == lines


def test_a_line_over_the_limit_is_refused_whether_or_not_its_newline_came() -> None:
    with pytest.raises(MessageTooLarge):
        LineSplitter(limit=8).feed(b"x" * 9)
    splitter = LineSplitter(limit=8)
    splitter.feed(b"xxxxx")
    with pytest.raises(MessageTooLarge):
        splitter.feed(b"xxxxx\n")
    assert LineSplitter(limit=8).feed(b"x" * 8 + b"\n") == [b"x" * 8]
