"""The integration tier: a real Trainer in this process, real files, the real readers (TensorBoard's
profiler plugin, memory_viz, HTA) and the real tracers (CONTRIBUTING.md)."""
