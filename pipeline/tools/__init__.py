"""Tools around the pipeline that are not stages: containers and the image store, team services,
the report, comparison, the benchmark scaffold, the stages' code dependencies, a client
benchmark."""
