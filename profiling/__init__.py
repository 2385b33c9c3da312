"""Tools for torch.profiler traces (exercise 01) and data-pipeline benchmarks (exercise 02)."""
