"""The local supervisor, its own program: `truestep launch` runs it on each node. It holds the run
directory lease, starts the ranks of one node (warm standbys when parked), watches them from their
heartbeats and from outside their interpreter, tears an attempt down on a failure or hang, drops the
failed ranks' snapshot memory, and restarts like a SLURM requeue would; across nodes it speaks only to
the job's other supervisors over the authenticated node link. What a rank does itself (its heartbeat,
its signals, its lease check) is resilience/'s.

`restart_loop` (the loop and its decisions), `driver` (spawning and watching one attempt's ranks: the
protocol tests replace), `watch` (the health rules), `outside` (/proc), `standby` and `handoff` (warm
standbys), `nodes`, `peers`, `node_loss` and the `link_*` modules (the node link), `memory_loss`.
"""
