"""The one LLM judge loop: every benchmark's judge requests, one repair, invalid verdicts
counted."""
