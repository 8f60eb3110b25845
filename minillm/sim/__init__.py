"""The simulator and the fleet: the engine's own scheduler and block manager on a virtual clock.

    pricing.py           Pricing: bytes per number, step overheads, the cost model, interference
    simulated_pool.py    the simulated GPU's KV pool: blocks left after the weights, per layout
    simulated_engine.py  Simulator: one engine's steps, each priced by a cost model
    simulator.py         simulate(): a workload through the simulated engine; goodput curves
    virtual_engines.py   pipeline parallelism: p engines with p batches in flight, as vLLM
    router.py            routers: round robin, prefix-aware with a load bound, or your own
    fleet.py             N replicas behind a router on one virtual clock: simulate_fleet()
    kv_handover.py       the decode replica that takes in prompt K/V computed elsewhere
    two_pools.py         disaggregation's run loop: prefill and decode pools, the K/V link

Every number these produce is modelled (the roofline's prices), never measured. Short names:
minillm.simulator is minillm.sim.simulator, and so on. A namespace: imports none of them.
"""
