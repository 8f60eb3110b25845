"""The prefix cache: K/V blocks a new request can reuse because an earlier one computed them.

    base.py          what BlockManager asks of a prefix cache (PrefixCache, PrefixMatch), and
                     the cache of a pool with prefix caching off
    hash_chain.py    vLLM's design: full blocks found by a hash chained over the prefix
    radix.py         SGLang's design: a radix tree of block runs keyed by tokens, evicting
                     least-recently-used leaves (page size of a block, or of one token)
    radix_tree.py    that tree's structure: its nodes, the match walk, splits
    radix_blocks.py  that tree kept over the pool's blocks, as BlockManager's prefix cache
    snapshot.py      the trace's view of the cache, rebuilt only when what it shows changed

A namespace: this file imports nothing.
"""
