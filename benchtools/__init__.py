"""What every benchmark shares: the results file it writes (`resultfiles`) and the machine it names
(`machine`). Above wellfno, below the tools (profiling, affinity) and coursetools (DESIGN.md: Layers)."""
