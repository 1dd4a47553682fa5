"""Test support: an OpenAI-compatible server with scripted answers, latency and faults (used by
the tests, the perf scripts and `lfbench bench`)."""
