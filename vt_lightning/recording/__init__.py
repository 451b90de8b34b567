"""Everything that runs in the training process and touches the world, only inside windows: the
Python and torch tracers, clock probes, memory snapshots, the spool of raw dumps, rival-profiler
checks, trigger probes, the Lightning-view hooks and DataLoader-worker tracing. Nothing here decides
*when* to record (that is the controller's, over ``analysis``)."""
