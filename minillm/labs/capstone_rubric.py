"""The capstone's rubric (exercise 11.2): the items, points and word count of its reasoning.

The grader (minillm/labs/ch11.py) checks what the configuration achieves; the reasoning is an
argument, which a keyword match cannot judge, so a person grades it on RUBRIC. The grader,
`python -m minillm.labs capstone NAME` and chapter 11 all print it with rubric_text().
"""

from __future__ import annotations

# What an instructor grades the reasoning on, by hand: (item, points, what earns them). Every
# item asks for what Recommendation.explain() does not print (it gives the recipe's layout, KV,
# chunk, search and cost lines), so pasting explain() earns nothing; the figures must be the
# student's own brief's, which the grader's verdict prints beside the rubric for checking.
RUBRIC = [
    ("binding", 2, "which SLO bound binds your deployment (the shares of requests meeting TTFT "
     "and TPOT from evaluate(...).shares) and the evidence: one knob moved one step past your "
     "choice (max_num_batched_tokens or max_num_seqs doubled, or one replica fewer), evaluated, "
     "and the bound it breaks"),
    ("alternative", 2, "at least one other layout you evaluated (a wider or narrower TP, or "
     "pipeline stages), with its modelled goodput and SLO attainment on your traffic, and why it "
     "loses there"),
    ("headroom", 2, "how far the offered rate can grow before your deployment misses the SLO "
     "(evaluate on dataclasses.replace(scenario, rate=...)), and the fewest GPUs that still "
     "meet it at the offered rate, with its $/1M tokens"),
    ("trust", 2, "the assumption of the model your answer is most sensitive to (steps priced "
     "at the roofline's peak, an even router, ...), how much it moves your result (e.g. a "
     "per-step overhead in run_deployment), and what you would measure on a real GPU to "
     "check it"),
    ("recipe", 2, "where your deployment differs from recommend()'s on your brief and why; if "
     "it is the same, which of your runs above confirm it, so the choice is yours and not "
     "only the recipe's"),
]
RUBRIC_POINTS = sum(points for _, points, _ in RUBRIC)
MIN_WORDS = 120  # the rubric's five items take a paragraph each, not a sentence


def rubric_text() -> str:
    return "\n".join(f"- {name} ({points} points): {what}" for name, points, what in RUBRIC)
