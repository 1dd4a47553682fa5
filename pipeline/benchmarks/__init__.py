"""One package per benchmark (`pipeline/benchmarks/<name>/`), each pure and registered by name
(see `pipeline.core.benchmark` and `pipeline.core.registry`). `_template` is the package a new
benchmark starts from (`lfbench new-benchmark NAME`)."""
