"""Signal agreement and emergency stop, NaN guard, heartbeats, collective timeouts, the local
supervisor. Each mechanism has a switch in [resilience] for the ablation study.

Exit codes: 0 = finished; resilience.requeue_exit_code (75) = preempted gracefully, emergency checkpoint
committed, requeue me; requeue_exit_code + 1 = the graceful path missed its deadline, still requeue;
anything else = failure.
"""
