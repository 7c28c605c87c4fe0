"""Benchmarks on real data: convergence, depth, speed and memory."""
