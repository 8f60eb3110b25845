"""Deployment planning: from a brief (model, GPUs, SLOs, traffic) to a configuration and a price.

    deployment.py      a multi-GPU deployment (TP x PP x replicas, scheduler knobs) and its
                       modelled run: run_deployment() -> goodput, SLO attainment, $/1M tokens
    recipe_steps.py    the recipe's steps 1-3: choose_layout, choose_max_num_seqs, the chunk
    recipe_search.py   step 4: the goodput search in the simulator, climb_max_num_seqs
    recipe.py          recommend(): the starting-config recipe as code, and its reasoning
    disaggregation.py  prefill and decode pools with the K/V shipped between them, and the
                       comparison with colocated serving at the recipe's configuration
    disaggregation_results.py  DisaggregatedResult, Comparison: what those runs report
    autoscale.py       what a fleet scales on: GPU busy time, queue depth, SLO attainment
    dashboard.py       a run as an operator reads it: p99s, goodput, preemptions/min, KV usage
    failure_modes.py   the guide's failure-modes table reproduced in the simulator
    diagnosis.py       seeded mystery deployments for the diagnosis lab
    capstone.py        chapter 11's capstone: worked briefs, each student's brief, evaluate()
    calibration.py     fit the simulator's step overheads to this machine and report its error

Short names: minillm.recipe is minillm.plan.recipe, and so on. A namespace: imports none of them.
"""
