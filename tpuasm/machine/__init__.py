"""The TPU v1 machine: state, numba core, pipeline timing and the reference model."""
