"""The course's own tools, which participants run but never read: the docs' tables and `make results`
(`results`, `measure`), the day-0 GPU check (`gpucheck`), The Well's metadata (`wellmeta`) and its
stand-ins (`standin`). The top of the tool layers (DESIGN.md: Layers)."""
