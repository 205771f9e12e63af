"""The broker state machine that composes the protocol parts — no I/O (DESIGN: sans-I/O cores)."""

from ges.core.broker import BrokerCore
from ges.core.config import BrokerConfig
from ges.core.outputs import CLIENT, DROP_PEER, NOTICE, PEER, ProtocolError

__all__ = ["CLIENT", "DROP_PEER", "NOTICE", "PEER", "BrokerConfig", "BrokerCore", "ProtocolError"]
