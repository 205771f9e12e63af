"""Exactly-once, in-order, gapless delivery (seed 002, seed 001, seed 000): the sans-I/O parts."""

from ges.reliable.knowledge import D, F, KnowledgeStream, Q, StreamFull

__all__ = ["D", "F", "Q", "KnowledgeStream", "StreamFull"]
