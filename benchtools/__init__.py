"""What every benchmark shares: the results file it writes (`resultfiles`), the machine it names
(`machine`), best-of-N rounds (`rounds`). Above wellfno, below the tools (profiling, affinity) and
coursetools (DESIGN.md: Layers)."""
