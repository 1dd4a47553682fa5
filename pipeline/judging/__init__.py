"""Judges that run without a model server (the `local` provider)."""
