"""The broker state machine that composes the protocol parts — no I/O (DESIGN: sans-I/O cores)."""

from ges.core.broker import CLIENT, DROP_PEER, NOTICE, PEER, BrokerCore, ProtocolError

__all__ = ["CLIENT", "DROP_PEER", "NOTICE", "PEER", "BrokerCore", "ProtocolError"]
