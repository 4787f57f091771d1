"""metrics.jsonl / events.jsonl writers (timestamps, attempt id), console progress, TensorBoard,
parameter digests. Observes; never decides."""
