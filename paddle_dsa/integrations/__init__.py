"""Adapters for model libraries built on Paddle (imported on demand: nothing here imports them at paddle_dsa import)."""
