"""The rich terminal view of a running topology."""

from ges.monitor.live import Monitor

__all__ = ["Monitor"]
