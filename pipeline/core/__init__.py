"""What every layer builds on: params (`config`), records, errors, file helpers (`io`), prompts,
lineage, answer parsing (`parse`), and the benchmark contract (`benchmark`) with its registry."""
