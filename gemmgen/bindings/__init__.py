"""Bindings step of the pipeline: load the generated libraries and expose them as torch ops."""
