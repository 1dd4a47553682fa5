"""Authoring: a new benchmark from the template, the model client's micro-benchmark."""
