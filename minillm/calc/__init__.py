"""The calculators: what a GPU, a model and a link can do, priced on paper.

    hardware.py     Hardware: datasheet peaks of common GPUs, their host links (HARDWARE) and
                    GPU-to-GPU links (LINKS: NVLink, PCIe, InfiniBand, Ethernet)
    models.py       named shapes of public models (llama-3-8b, qwen3-0.6b, ...)
    sizing.py       KV-cache and weight bytes, the KV wall (max_concurrency), $ per 1M tokens
    roofline.py     ridge points, the step cost model, measure_machine()
    step_cost.py    StepCost, SerialStepCost: what the cost model returns for a step
    step_overheads.py  StepOverheads: what a step costs beyond its roofline (calibration fits it)
    collectives.py  what crossing a link costs: ring all-reduce, sends, pipeline bubbles
    parallel.py     tensor and pipeline parallelism: weights and KV per GPU, a TP x PP step's cost
    preemption.py   what a preemption costs on a GPU, recompute vs swap, and the crossover
    machine.py      describe() / settle_threads(): the hardware a chapter measured on
    percentiles.py  percentiles with linear interpolation, how many samples a percentile needs

They sit at the bottom of the house: they import no engine code, so a chapter can price a
deployment without loading a model. Those that were once top-level modules are importable by
their short names too (minillm.roofline is minillm.calc.roofline; minillm.MOVED lists them).
A namespace: this file imports none of them.
"""
