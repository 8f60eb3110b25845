"""The prefix cache: K/V blocks a new request can reuse because an earlier one computed them.

    radix.py  SGLang's design: a radix tree of block runs keyed by tokens, evicting
              least-recently-used leaves (page size of a block, or of one token)

A namespace: this file imports nothing.
"""
