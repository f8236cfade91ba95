"""paddle_dsa.nn: ``from paddle_dsa.nn import functional as F``."""
from . import functional  # noqa: F401
