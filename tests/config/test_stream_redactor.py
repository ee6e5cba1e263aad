"""A server's output redacted on its way to the log: whatever the chunking, what is written is
what :meth:`Redactor.text` makes of the whole, and no piece written holds a secret value."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from autotune.config.secrets import Redactor, StreamRedactor

TOKEN = "hf_SeCrEt0123456789"
KEY = "sk-KeY-98765"
REDACTOR = Redactor({"HF_TOKEN": TOKEN}, ["serve", "--api-key", KEY])

pieces = st.sampled_from([TOKEN, KEY, TOKEN[:5], KEY[:-1], "hf_", "sk-", "\n", " ", "é", "x" * 20, "\r"])


@settings(max_examples=200, deadline=None)
@given(st.lists(pieces, max_size=30), st.lists(st.integers(1, 17), min_size=1, max_size=60))
def test_any_chunking_writes_the_redacted_whole(words: list[str], cuts: list[int]) -> None:
    data = "".join(words).encode()
    stream = StreamRedactor(REDACTOR)
    written, at, i = [], 0, 0
    while at < len(data):
        size = cuts[i % len(cuts)]
        written.append(stream.feed(data[at:at + size]))
        at, i = at + size, i + 1
    written.append(stream.end())
    assert b"".join(written) == REDACTOR.text(data.decode()).encode()
    for piece in written:
        assert TOKEN.encode() not in piece and KEY.encode() not in piece


def test_text_without_secrets_passes_at_once() -> None:
    stream = StreamRedactor(REDACTOR)
    assert stream.feed(b"loading weights\n") == b"loading weights\n"
    assert stream.feed(b"key hf_SeC") == b"key "  # held: it may be the start of the token
    assert stream.feed(b"rEt0123456789 ok") == b"${HF_TOKEN} ok"
    assert StreamRedactor(Redactor({}, ["serve"])).feed(b"hf_SeC") == b"hf_SeC"  # no secret: nothing held
