"""Prompt-lookup decoding: guess the next tokens from the request's own text, with no model.

Text that quotes, repeats or edits its context (code, summaries, a play's speaker names) often
continues the way an earlier occurrence of its last few tokens did. The guess costs a search;
the target model checks it for free in the forward it runs anyway (Saxena 2023, "prompt lookup
decoding"; vLLM's "ngram" method).
"""

from __future__ import annotations

from collections.abc import Sequence


def propose_ngram(token_ids: Sequence[int], k: int, lookup_max: int, lookup_min: int = 1
                  ) -> list[int]:
    """Up to k tokens that followed the latest earlier occurrence of the last n tokens, for the
    longest n in [lookup_min, lookup_max] that occurs; [] when none does.

    The latest occurrence is the likeliest to be continued the same way (the text near the end
    is the most alike); the longest n is the most specific match.
    """
    length = len(token_ids)
    for n in range(min(lookup_max, length - 1), lookup_min - 1, -1):
        suffix = list(token_ids[length - n:])
        # An occurrence must end before the suffix itself does, and leave a token after it.
        for start in range(length - n - 1, -1, -1):
            if token_ids[start] == suffix[0] and list(token_ids[start:start + n]) == suffix:
                return list(token_ids[start + n:start + n + k])
    return []
