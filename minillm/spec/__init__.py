"""Speculative decoding: propose k tokens cheaply, check them all in one target forward.

config: SpeculativeConfig (LLM(speculative_config={...})).
"""

from minillm.spec.config import SpeculativeConfig

__all__ = ["SpeculativeConfig"]
