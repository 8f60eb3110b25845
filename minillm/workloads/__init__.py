"""Workloads: the request streams every run serves, and the one driver that releases them.

    streams.py   RequestSpec and Workload; Poisson (open loop), closed loop, bursty and
                 shared-prefix streams; Arrivals, the one arrival loop of
                 the simulator, the fleet, disaggregation, the replay and the real run
    lengths.py   length distributions (Fixed, Uniform, LogNormal, Mixture, Choice), re-exported
                 by streams
    prefixes.py  shared-prefix and multi-turn workloads with explicit token ids, and the ceiling
                 an ideal prefix cache reaches on them

Short names: minillm.workload is streams, minillm.prefix_workload is prefixes. A namespace: this
file imports neither.
"""
