"""Speculative decoding: propose k tokens cheaply, check them all in one target forward.

config: SpeculativeConfig (LLM(speculative_config={...})).
cost: the tokens a target step yields (expected_tokens_per_step) and their price on the roofline
    (speculative_step_time, speculative_speedup, best_num_speculative_tokens), refusing a
    batch whose weights and K/V do not fit (check_fits).
simulate: the simulator's stand-in for proposing and checking (imported by minillm.simulator).

A namespace: import from the module that owns a name (the config sits beneath the engine, the
cost model beside the calculators), so this file imports none of them.
"""
