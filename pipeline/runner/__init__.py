"""Running the stages: `lfbench repro` (driver: the stages side by side on Dask; task: one
stage's command as a Dask task; cluster: the scheduler and a worker's clone; view: the live
view), `lfbench worker`, `lfbench prune`."""
