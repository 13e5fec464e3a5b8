"""The project's benchmarks: one harness (:mod:`benchmarks.harness`) and one module per study
(:mod:`benchmarks.scenarios`). Run them with ``python -m benchmarks list`` and ``python -m benchmarks run NAME``."""
