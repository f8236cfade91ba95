"""Run-time switches of the kernel seams read from the environment (no cutlass import here): one checked choice
among named values, the first being the default."""
import os


def choice(value, what, choices):
    """value (None or "" -> choices[0]) if it is one of choices, else ValueError naming `what`."""
    value = choices[0] if value in (None, "") else str(value)
    if value not in choices:
        raise ValueError(f"{what} must be one of {choices}, got {value!r}")
    return value


def env_choice(name, choices):
    """The environment variable `name` as a choice (read when called: at import for the seams' module defaults)."""
    return choice(os.environ.get(name, "").strip(), name, choices)
