"""The trio runtime: the only part of GES that awaits, opens sockets or starts processes."""

from ges.runtime.broker import BrokerServer

__all__ = ["BrokerServer"]
