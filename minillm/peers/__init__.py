"""Other engines beside minillm, on the reader's own machine: set up and served, never imported.

    vllm.py       vLLM's CPU build in a virtual environment of its own: the set-up, its
                  workarounds, and its server (VLLMServer) as ServerProcess runs minillm's
    __main__.py   python -m minillm.peers setup vllm | status

Nothing here is imported by the engine, and everything in the book works without a peer: where
one is not set up, a chapter or a test says so and how to set it up.
"""
