"""What a broker core returns, and the error that closes a connection.

Theory of operation
-------------------
Every input to :class:`ges.core.BrokerCore` returns a list of outputs for the driver (the trio
runtime or the simulator) to perform, in order, as ``(kind, destination, message)`` tuples:

* ``(PEER, broker_id, message)`` — send to a neighbouring broker;
* ``(CLIENT, conn_id, message)`` — send to a connected client;
* ``(DROP_PEER, broker_id, reason)`` — close that link (the failure detector suspects it);
* ``(NOTICE, level, text)`` — a line for the operator's log, level "info" or "warning".

The parts of the core (ges.core.*) build them with the helpers here. A message a peer or client
should not have sent raises :class:`ProtocolError`: the driver closes that one connection.
"""

from __future__ import annotations

import msgspec

PEER = 0
CLIENT = 1
DROP_PEER = 2
NOTICE = 3


class ProtocolError(Exception):
    """A peer or client sent a message that is not valid at this point; close its connection."""


def hop(msg, hops: int, detour: list):
    """A unicast message one hop further on (every field kept but these)."""
    return msgspec.structs.replace(msg, hops=hops, detour=detour)


def epoch_of(pubend: str) -> int:
    """A pubend's epoch (``<broker>~<epoch>``); -1 if it names none."""
    epoch = pubend.partition("~")[2]
    return int(epoch) if epoch.isascii() and epoch.isdigit() and len(epoch) <= 18 else -1
