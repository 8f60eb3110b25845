"""The checkpoint's own tokenizer (through transformers) and incremental detokenization."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def load_tokenizer(path: str | Path) -> Any | None:
    """The tokenizer saved with a checkpoint, or None when the folder has none."""
    folder = Path(path)
    if not any((folder / f).exists() for f in ("tokenizer.json", "tokenizer.model",
                                               "tokenizer_config.json")):
        return None
    from transformers import AutoTokenizer  # imported here: it is slow and often not needed

    return AutoTokenizer.from_pretrained(str(folder))


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas, one step at a time.

    Decoding only a short window of recent tokens keeps each step cheap, and decoding the window
    with and without the new tokens keeps word boundaries right. A delta that ends in an
    incomplete UTF-8 character is held back until the rest of its bytes arrive.
    """

    def __init__(self, tokenizer: Any, prompt_token_ids: list[int]):
        self.tokenizer = tokenizer
        self.read_offset = len(prompt_token_ids)  # tokens already turned into text
        self.prefix_offset = max(self.read_offset - 6, 0)  # start of the context window

    def step(self, token_ids: list[int]) -> str:
        """The text that token_ids (prompt + all output so far) adds to the text so far."""
        if self.tokenizer is None:
            return ""
        decode = self.tokenizer.decode
        before = decode(token_ids[self.prefix_offset:self.read_offset], skip_special_tokens=True)
        after = decode(token_ids[self.prefix_offset:], skip_special_tokens=True)
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return ""
        self.prefix_offset, self.read_offset = self.read_offset, len(token_ids)
        return after[len(before):]


def find_stop(text: str, old_len: int, stop_strings: list[str]) -> int | None:
    """Where text must be cut for the first stop string that its new part (from old_len on)
    completes, or None. A stop string may begin before old_len and end in the new text."""
    for stop in stop_strings:
        at = text.find(stop, max(0, old_len - len(stop) + 1))
        if at >= 0:
            return at
    return None
