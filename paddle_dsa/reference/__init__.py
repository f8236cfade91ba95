"""Pure-Paddle reference implementations: the CPU fallback and the oracle of the GPU tests."""
