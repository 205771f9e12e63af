"""Content routing (seed 004 §3): profile propagation to the keepers of each unit, and the
destinations and next hops of events. Sans-I/O; the broker core drives it."""

from ges.routing.export import Exporter
from ges.routing.hierarchy import Hierarchy
from ges.routing.table import ContentRouter

__all__ = ["ContentRouter", "Exporter", "Hierarchy"]
