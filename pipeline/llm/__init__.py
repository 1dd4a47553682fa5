"""LLM access for the pipeline: an OpenAI-compatible client with cache, journal and retries.

`types` holds the records (endpoint, request, result, usage); `client` sends requests.
"""
