"""`truestep audit`: the instrument for any trainer. A user's own training command runs as a black box
(its own process group, watched through its logs, killed or preempted from outside, started again as a
scheduler would), and its runs are written as truestep run directories that the analysis room judges
with the same floor, verdict, evidence ledger, goodput, MTTR and report as `truestep experiment`.

Modules: spec (the command line's --logs, --fault, --tags), readers (TensorBoard event files, Trainer's
trainer_state.json, JSON lines: bounded, never unpickled), tfevents (the TFRecord/protobuf parser),
weights (the final weights' digest), job (one run: launch, watch, fault, restart, every phase timed),
rundir (a job's record as metrics.jsonl and events.jsonl), plan (the runs of an audit and their verdict).
docs/audit.md has the worked example.
"""
