"""Natural batching: the outputs of one turn as fewer, larger messages (issue 21).

Theory of operation
-------------------
A driver hands its core everything one read returned before it writes anything (the trio
runtime's pump; nats-server coalesces its flushes the same way). A burst of single-event
publishes then returns, for each publish, a ``PubAck`` to its publisher, a ``Deliver`` to each
matching subscription and an ``Events`` to each link it is routed on. :func:`coalesce` turns
each destination's run of such messages into one:

* consecutive ``Deliver`` of one subscription and pubend: one ``Deliver``, the items in order;
* consecutive ``Events`` of one pubend and VT digest: one ``Events``;
* ``PubAck`` of consecutive publishes whose ticks follow on, none with duplicates: one
  ``PubAck`` covering them (``seqs`` of them; the publisher knows how many events each had, so
  it can tell each one's ticks).

Only messages to the same destination with nothing else for it in between are joined, so every
destination receives the same things in the same order, in fewer frames; what goes to different
destinations was never ordered (separate connections, separate writers). A joined message takes
the place of the first of its run. An event that arrives alone has nothing to join with, and
goes out as soon as it did before.

A joined message carries at most :data:`JOIN_BYTES` of events (past that a new run starts): a
burst comes out as frames of that size, which the receiver — a subscriber, or a neighbouring
broker whose loop handles one message at a time — takes in pieces as small as its turns.

A message the core built once for several destinations (one ``Deliver`` for every subscriber
with the same interests, which the driver encodes once) stays shared: runs made of the same
messages become the same joined message.
"""

from __future__ import annotations

from ges.core.outputs import DropPeer, ToClient, ToPeer
from ges.wire import messages as m
from ges.wire.messages import event_size

#: Bytes of events (as ``event_size`` counts them) a joined Deliver or Events carries at most.
JOIN_BYTES = 64 * 1024


def coalesce(outs: list) -> list:
    """``outs`` with each destination's runs of joinable messages joined (see the module): a
    new list."""
    if len(outs) < 2:
        return list(outs)
    result: list = []
    runs: dict[int, list] = {}  # index in result -> the messages joined there (2 or more)
    sizes: dict[int, int] = {}  # index in result -> the bytes of events in its run
    sized: dict[int, int] = {}  # id of a message -> the bytes of its events (shared ones once)
    last: dict = {}  # destination (a peer's name, a connection's number) -> its last index
    for out in outs:
        kind = type(out)
        if kind is ToPeer:
            dest = out.peer
        elif kind is ToClient and out.conn >= 0:
            dest = out.conn
        else:  # not a message to a connection: kept in its place
            if kind is DropPeer:
                last.pop(out.peer, None)
            result.append(out)
            continue
        msg = out.msg
        at = last.get(dest)
        if at is not None:
            run = runs.get(at)
            first = result[at].msg
            if _joinable(first if run is None else run[-1], msg):
                size = sizes.get(at)
                if size is None:
                    size = _size(first, sized)
                size += _size(msg, sized)
                if size <= JOIN_BYTES:
                    sizes[at] = size
                    if run is None:
                        runs[at] = [first, msg]
                    else:
                        run.append(msg)
                    continue
        last[dest] = len(result)
        result.append(out)
    if runs:
        joined: dict[tuple, m.Message] = {}  # the ids of a run -> its message (shared runs)
        for at, run in runs.items():
            key = tuple(map(id, run))
            msg = joined.get(key)
            if msg is None:
                msg = joined[key] = _join(run)
            out = result[at]
            result[at] = ToPeer(out.peer, msg) if type(out) is ToPeer else ToClient(out.conn, msg)
    return result


def _size(msg, sized: dict) -> int:
    size = sized.get(id(msg))
    if size is None:
        items = getattr(msg, "items", None)
        size = sized[id(msg)] = sum(event_size(it.event) for it in items) if items else 0
    return size


def _joinable(a, b) -> bool:
    kind = type(a)
    if kind is not type(b):
        return False
    if kind is m.Deliver:
        return a.sub_id == b.sub_id and a.pubend == b.pubend
    if kind is m.Events:
        return a.pubend == b.pubend and a.vm == b.vm
    if kind is m.PubAck:
        return (
            a.pubend == b.pubend
            and not a.duplicates
            and not b.duplicates
            and b.seq - b.seqs == a.seq
            and a.first_tick <= a.last_tick
            and b.first_tick == a.last_tick + 1
            and b.first_tick <= b.last_tick
        )
    return False


def _join(run: list):
    first, end = run[0], run[-1]
    kind = type(first)
    if kind is m.PubAck:
        seqs = sum(a.seqs for a in run)
        return m.PubAck(end.seq, first.pubend, first.first_tick, end.last_tick, 0, seqs)
    items = [it for msg in run for it in msg.items]
    if kind is m.Deliver:
        return m.Deliver(first.sub_id, first.pubend, items)
    return m.Events(first.pubend, items, first.vm)
