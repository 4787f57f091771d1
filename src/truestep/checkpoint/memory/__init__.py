"""In-memory snapshots and the recovery from them (resilience.snapshot_every_steps).

Every k steps each rank copies its whole trajectory state into host memory (`snapshotter`), in the
background, and a copy reaches its buddies (`replicate`); a step is agreed once every rank holds its own
copy and its buddies' (an all-reduce, like a commit marker). After a failure the survivors restore the
last agreed step from their own memory and a replaced rank from a buddy's copy, digest-checked
(`restore`); the disk is the fallback, said in one line. `holder` is one rank's memory on its host,
`payload` the bytes of one copy, `budget` what it all costs in host memory.
"""
