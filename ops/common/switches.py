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


def knob_value(text):
    """A class knob's value written on a command line or in an environment variable: an int ("2", "-1"), a tuple of
    ints with ':' between them ("11:10"), else the string itself ("key")."""
    text = text.strip()
    parts = text.split(":")
    if all(p.strip().lstrip("-").isdigit() for p in parts):
        return int(text) if len(parts) == 1 else tuple(int(p) for p in parts)
    return text


def knob_specs(text):
    """"NAME=VALUE,NAME=VALUE" (knob_value's forms) as a dict; empty text: {}."""
    return {name.strip(): knob_value(value) for name, value in
            (spec.split("=", 1) for spec in filter(None, (text or "").split(",")))}


def dims_knob(knob):
    """A head-dim knob (a class attribute naming the head dims a kernel form applies to) as a tuple: a tuple, or one
    int as a knob spec gives it ("128"; "0": none)."""
    return tuple(knob) if isinstance(knob, (tuple, list)) else (int(knob),)
