"""Serving a trained model over HTTP (`attnx serve`); needs the `serve` extra (LitServe)."""
