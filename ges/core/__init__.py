"""The broker state machine that composes the protocol parts — no I/O (DESIGN: sans-I/O cores)."""

from ges.core.broker import BrokerCore
from ges.core.config import BrokerConfig
from ges.core.outputs import DropPeer, Notice, Output, ProtocolError, ToClient, ToPeer

__all__ = [
    "BrokerConfig",
    "BrokerCore",
    "DropPeer",
    "Notice",
    "Output",
    "ProtocolError",
    "ToClient",
    "ToPeer",
]
