"""The system tier: subprocesses (the example, the CLI, the writer process, scripts), DDP, a live
TensorBoard server, faults, the benchmarks' smoke test (CONTRIBUTING.md)."""
