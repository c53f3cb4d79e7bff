"""Decoding: search over the model's incremental `decode_step` and the commands built on it."""
