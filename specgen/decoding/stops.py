"""Where a row's output ends: stop token ids and stop strings, the strings checked over a tail window of its text."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

#: characters a window's text may differ from the whole text's at its start (a token cut off from the bytes before it
#: decodes to one U+FFFD per byte, at most 3 of a 4-byte character; a decoder may strip the first token's leading
#: space): the window reaches this much further back than the longest stop string, so its start never matters
MARGIN = 8


@dataclass(frozen=True)
class Stops:
    """Where a row ends: at its first stop token, or at the first token whose text completes a stop string (the
    text of `decode(tokens[:k])` contains it); either token is kept, and the completion's text is cut before the
    stop string (`cut`). `decode`: token ids -> text, as the completion is decoded (needed with strings)."""

    ids: tuple[int, ...] = ()
    strings: tuple[str, ...] = ()
    decode: Callable[[list[int]], str] | None = None

    def __post_init__(self) -> None:
        # an empty string is in every text (each row would end at its first token); the CLI refuses it before here
        if "" in self.strings or (self.strings and self.decode is None):
            raise ValueError("stop strings must be non-empty and come with a decode")

    @property
    def reach(self) -> int:
        """Characters of text before the new tokens' that a window holds: any stop string ending in the new text
        starts within them."""
        return max(map(len, self.strings)) + MARGIN

    def end(self, out: list[int], start: int, limit: int) -> int | None:
        """The length of `out` through its first stop, looking at out[start:limit] (those before `start` were looked
        at and hold none); None: no stop there."""
        last = min(limit, len(out))
        at = next((i + 1 for i in range(start, last) if out[i] in self.ids), None)
        if self.strings:  # a string completed before the stop token ends the row first
            at = self.string_end(out, start, at or last) or at
        return at

    def kept(self, out: list[int], limit: int) -> list[int]:
        """What a row keeps of its tokens `out`: through its first stop and within `limit` tokens (tokens a
        multi-token step produced past either are dropped). Every benchmark row, specgen's or a peer's, keeps this."""
        return out[: self.end(out, 0, limit) or limit]

    def string_end(self, out: list[int], start: int, last: int) -> int | None:
        """The first k in (start, last] whose text completes a stop string, decoding only a tail window per k (the
        whole text at every step is O(n^2)). Exact for decoders whose text of a prefix is the whole text's prefix,
        up to characters still incomplete at its end (byte-level BPE: the U+FFFD of a partial UTF-8 character)."""
        if last <= start:
            return None
        w = self.window_start(out, start)
        return next((k for k in range(start + 1, last + 1) if self.found(self.decode(out[w:k]))), None)

    def window_start(self, out: list[int], start: int) -> int:
        """A w <= start whose out[w:start] decodes to at least `reach` characters, or 0: the window grows back by
        doubling (a token may decode to no character at all, a skipped special one)."""
        n = self.reach  # tokens: most decode to a character or more, so one decode usually suffices
        while start - n > 0 and len(self.decode(out[start - n:start])) < self.reach:
            n *= 2
        return max(0, start - n)

    def found(self, text: str) -> bool:
        return any(s in text for s in self.strings)

    def cut(self, text: str) -> int:
        """Where the completion ends in `text`: the start of its first stop string, else its length."""
        return min((i for s in self.strings if (i := text.find(s)) >= 0), default=len(text))

    def pending(self, text: str) -> int:
        """Characters at the end of `text` that may begin a stop string (the longest proper prefix of one it ends
        with): a stream holds them back until the next tokens tell."""
        return max((j for s in self.strings for j in range(min(len(s) - 1, len(text)), 0, -1)
                    if text.endswith(s[:j])), default=0)


def text_stops(tokenizer, strings: Sequence[str] = ()) -> Stops:
    """A text model's stops: its tokenizer's stop ids and `strings`, matched in the text its `decode` gives."""
    return Stops(tuple(tokenizer.stop_ids), tuple(strings), tokenizer.decode)


def stops_of(stops: Stops | Sequence[int]) -> Stops:
    """`stops` as Stops: a sequence is stop ids alone (the loop's callers that stop on token ids)."""
    return stops if isinstance(stops, Stops) else Stops(tuple(stops))
