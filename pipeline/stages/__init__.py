"""The stage layer: every file read and write, every model call, MLflow and lineage.

One module per stage of dvc.yaml (`construct`, `generate`, `judge`, `aggregate`, `agreement`,
`train_judge`), the same for every benchmark; each loads the benchmark it is asked for from the
registry and calls its pure methods (`pipeline.core.benchmark`). `common` holds what they share
and `tracking` the MLflow runs.
"""
