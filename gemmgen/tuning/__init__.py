"""Tuning: measure every candidate kernel over a shape grid on the GPU, write the dispatch table, prune the kernel set."""
