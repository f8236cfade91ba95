"""The running Paddle release's port (paddle_dsa.ports.PORT), imported once."""
from .ports import PORT  # noqa: F401
