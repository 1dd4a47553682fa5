"""The local judge (the `local` provider): MiniLM features and a calibrated classifier, trained on
released judgements; runs on CPU with no model server."""
