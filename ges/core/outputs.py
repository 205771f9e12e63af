"""What a broker core returns, and the error that closes a connection.

Theory of operation
-------------------
Every input to :class:`ges.core.BrokerCore` returns a list of outputs for the driver (the trio
runtime or the simulator) to perform, in order. An output is one of four small values:

* :class:`ToPeer` ``(peer, msg)`` — send ``msg`` to the neighbouring broker ``peer``;
* :class:`ToClient` ``(conn, msg)`` — send ``msg`` to the client on connection ``conn``;
* :class:`DropPeer` ``(peer, reason)`` — close the link to ``peer`` (the failure detector
  suspects it);
* :class:`Notice` ``(level, text)`` — a line for the operator's log, level "info" or "warning".

A driver dispatches on the type (``type(out) is ToPeer``, not ``match``, which is slower).
There is one output per frame sent, so they are frozen msgspec structs: of the frozen forms
measured they cost least, within some 20 ns an output of a ``(kind, destination, message)``
tuple to build and dispatch on, where attrs classes cost some 350 ns more. They compare and
print by field, so a test says ``assert out == [ToClient(1, m.SubAck(2))]`` and a failure shows
what was sent where. They hold no reference back to anything that holds them, so the garbage
collector need not track them (``gc=False``, as the wire's messages).

The parts of the core (ges.core.*) build them; the router answers ``(peer, msg)`` pairs, which
the core turns into :class:`ToPeer` outputs for the links that are up. A message a peer or
client should not have sent raises :class:`ProtocolError`: the driver closes that one
connection.
"""

from __future__ import annotations

import msgspec

from ges.wire import messages as m


class ToPeer(msgspec.Struct, frozen=True, gc=False):
    """Send ``msg`` to the neighbouring broker ``peer`` (if its link is still up)."""

    peer: str
    msg: m.Message


class ToClient(msgspec.Struct, frozen=True, gc=False):
    """Send ``msg`` to the client on connection ``conn`` (if it is still connected)."""

    conn: int
    msg: m.Message


class DropPeer(msgspec.Struct, frozen=True, gc=False):
    """Close the link to ``peer``, saying ``reason`` (the failure detector suspects it)."""

    peer: str
    reason: str


class Notice(msgspec.Struct, frozen=True, gc=False):
    """A line for the operator's log; ``level`` is "info" or "warning"."""

    level: str
    text: str


#: What a broker core's inputs return a list of.
Output = ToPeer | ToClient | DropPeer | Notice


class ProtocolError(Exception):
    """A peer or client sent a message that is not valid at this point; close its connection."""


def hop(msg, hops: int, detour: list):
    """A unicast message one hop further on (every field kept but these)."""
    return msgspec.structs.replace(msg, hops=hops, detour=detour)
