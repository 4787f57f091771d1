"""`truestep plan`: the correct goodput a job will get at a target size, and what buys it.

Modules: inputs (every input, typed, with provenance), failures (failure rates and kinds, the Llama 3
mix), fit (costs measured from run directories through the analysis room), scaling (model shape ->
bytes per rank -> save and restore time), build (inputs assembled: defaults, measured, set,
extrapolated), scenario (inputs -> simulation parameters, the mechanism variants), simulate (the
vectorized Monte Carlo core), formulas (Young, Daly), study (what a plan computes), report and plots
(plan.md, plan.html, plan.json, plots/). docs/plan.md states the model and its assumptions.
"""
