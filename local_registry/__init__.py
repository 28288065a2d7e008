"""A small Confluent-compatible schema registry for tests and the demo (see server.py)."""

from local_registry.server import LocalRegistry

__all__ = ["LocalRegistry"]
