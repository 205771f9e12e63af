"""The message set shared by brokers and clients, encoded with msgspec's msgpack.

Messages are tagged, array-like msgspec structs: compact on the wire, validated on decode (a
wrong type anywhere is an undecodable frame). Events travel as binary; XML is only an edge
format. The forwarded event item is designed for the reliable-delivery work that follows:
``(pubend, tick, prev)`` lets a downstream broker know the ticks in between were silence on this
path (DESIGN "Data flows").
"""

from __future__ import annotations

import msgspec

from ges.wire.frames import DEFAULT_MAX_FRAME, HEADER_SIZE, PROTOCOL_VERSION, FrameError, frame

Value = str | int | float | bool


class Event(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A published event: typed attributes, an opaque payload, the publisher's clock (ns)."""

    attributes: dict[str, Value]
    payload: bytes = b""
    published_at: int = 0


class Route(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """Where a forwarded event still has to go (seed 004 §3.3, event routing).

    ``unit`` is a unit path (``()`` is the whole system), or a cluster path plus a broker id for
    one broker. The receiver delivers (a broker: itself), passes the route on towards the unit
    (outside it), or — inside it — has the unit's destinations computed by a keeper of the unit:
    the children whose profiles match, except ``skip`` (the child the event came from, which
    another route covers). ``via`` names the keeper a route inside the unit is travelling to.

    ``detour`` is a list of brokers to pass through first, for a route that goes round a unit
    split inside (see ``ContentRouter._detour``); empty otherwise.

    ``prev`` is the route's *knowledge claim* (reliable delivery, seed 002 §2.2): the broker that
    made this route (the publisher, or the keeper that matched the unit above) knows that no tick
    of the pubend strictly between ``prev`` and this item's tick had anything for ``unit``. Relays
    pass it on unchanged; see :mod:`ges.reliable.claims`.
    """

    unit: tuple[str, ...]
    skip: str = ""
    via: str = ""
    detour: tuple[str, ...] = ()
    prev: int = 0


class EventItem(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """An event at a position of its pubend's stream, as forwarded between brokers.

    ``prev`` is the previous tick sent on the path this item travels (seed 002 §2: the ticks in
    between are silence for this path); ``hops`` counts broker-to-broker links crossed; ``to``
    says where the event still has to go and ``path`` where it has been (both empty when
    flooding and in ``Deliver``).
    """

    tick: int
    prev: int
    hops: int
    event: Event
    to: tuple[Route, ...] = ()
    #: the brokers this copy has passed through (content routing); each delivered it to its own
    #: matching subscribers on the way, so no keeper sends it back to them
    path: tuple[str, ...] = ()


class Constraint(msgspec.Struct, array_like=True, frozen=True):
    """``attr op value`` (ops: eq ne lt le gt ge prefix exists in; ``in`` takes a list)."""

    attr: str
    op: str
    value: Value | list[Value] | None = None


class _Msg(msgspec.Struct, tag=True, array_like=True):
    pass


# -- handshake ---------------------------------------------------------------------------------


class Hello(_Msg):
    """First frame on every connection: who is calling and for which network — the topology's
    name, its content digest (``Topology.digest``: two files describing different networks
    differ in it even when they share a name), and the file it was read from (named in a
    refusal, so an operator can tell which side runs what)."""

    role: str  # "broker" | "client"
    id: str
    topology: str
    proto: int = PROTOCOL_VERSION
    digest: str = ""
    source: str = ""
    #: a client's token (``ges users add``), sent only over TLS; empty: none
    secret: str = ""


def hello_for(topology, role: str, id: str, secret: str = "") -> Hello:
    """The Hello of a broker or client running ``topology`` (a Topology: its name, digest and
    file; a name alone; or None for an anonymous client)."""
    if topology is None or isinstance(topology, str):
        return Hello(role=role, id=id, topology=topology or "", secret=secret)
    return Hello(
        role=role,
        id=id,
        topology=topology.name,
        digest=topology.digest,
        source=str(topology.source),
        secret=secret,
    )


class Welcome(_Msg):
    broker: str
    incarnation: str


class Refuse(_Msg):
    reason: str


# -- broker ↔ broker ---------------------------------------------------------------------------


class Heartbeat(_Msg):
    """Broker links: sent on an idle link (the failure detector). Clients: a keepalive."""


class Bye(_Msg):
    """A broker stopping (an operator stopped it) tells its neighbours before its links close,
    so they log the link going down as what it is, not as a failure."""

    reason: str = "stopping"


class LinkState(msgspec.Struct, array_like=True, frozen=True):
    """Connection information (seed 004 §2.2): one endpoint's view of one link.

    Carries both endpoints' full unit addresses; each receiver re-expresses the link for its
    own connectivity graph. ``version`` = (incarnation, seq) orders one reporter's reports;
    ``cost`` is the link's cost override (None: the link cost matrix decides).
    """

    a: str
    b: str
    a_unit: list[str]
    b_unit: list[str]
    cost: float | None
    reporter: str
    version: tuple[int, int]
    up: bool


class Connectivity(_Msg):
    """Link states disseminated within their context, batched per neighbour."""

    reports: list[LinkState]


class ProfileChange(msgspec.Struct, array_like=True, frozen=True):
    """One change to a broker's aggregated profile (seed 004 §3.2).

    ``(origin, inc, seq)`` is the change's unique id. ``op``: 1 adds ``conjunction``, 2 removes
    the one added as ``seq``; 0 is a *sync*: the origin's complete set of live ``seqs`` as of
    ``seq`` for incarnation ``inc`` (anything else of the origin's up to ``seq``, and everything
    of an older incarnation, is gone).
    """

    origin: str
    inc: int
    seq: int
    op: int
    conjunction: list[Constraint] = []
    seqs: list[int] = []


class Profiles(_Msg):
    """Profile changes on their way to the keepers named in ``to`` (relayed hop by hop)."""

    to: list[str]
    changes: list[ProfileChange]
    hops: int = 0
    #: brokers to pass through first, as in :class:`Route`
    detour: list[str] = []
    #: sent again by the origin (a sync): keepers acknowledge every change, known or not
    resend: bool = False


class ProfileAck(_Msg):
    """A keeper holds the adds ``seqs`` of ``origin``'s incarnation ``inc`` and has applied the
    removals ``removed``."""

    origin: str
    keeper: str
    inc: int
    seqs: list[int]
    hops: int = 0
    removed: list[int] = []
    #: brokers to pass through first, as in :class:`Route`
    detour: list[str] = []
    #: reliable delivery: the last tick of each pubend this keeper had routed when it applied
    #: the adds; later ticks are routed with them (the subscription's starting point)
    ticks: list[tuple[str, int]] = []


class Events(_Msg):
    """A batch of one pubend's events forwarded between brokers.

    ``vm`` is the digest of the VT vector V_m the pubend stamped these events with (seed 000
    §5.1; 0: the empty vector). A :class:`Vector` with the digest precedes the first frame
    carrying it on each link."""

    pubend: str
    items: list[EventItem]
    vm: int = 0


class Silence(_Msg):
    """No data of ``pubend`` for the routes' units up to and including ``tick`` (seed 002 §2.2:
    silence on an idle path). Routed like an event whose routes claim ``(prev, tick]``."""

    pubend: str
    tick: int
    to: list[Route]
    hops: int = 0
    #: the digest of the pubend's V_m when it sent this silence, as in :class:`Events`
    vm: int = 0


class Nack(_Msg):
    """Curiosity (seed 002 §2.3): ``origin`` does not know the ticks ``ranges`` (inclusive
    ``[lo, hi]`` pairs) of ``pubend``; relayed to the pubend's broker, which answers from its
    log."""

    pubend: str
    origin: str
    ranges: list[tuple[int, int]]
    hops: int = 0
    detour: list[str] = []
    #: a replicator recovering what it missed while it was down (ges.core.replicator): only the
    #: pubend's log answers (a keeper's cache knows only what its profiles wanted then), and a
    #: range past its last committed tick is answered as empty up to it
    replay: bool = False


class Recovered(_Msg):
    """The answer to a nack for ticks ``lo..hi``, relayed to ``to``, which filters the events
    itself: from the pubend's log, every event in the range (a tick it lacks had none); from a
    keeper's cache, every event in the range that anything in ``unit`` could want."""

    pubend: str
    to: str
    lo: int
    hi: int
    items: list[EventItem]
    hops: int = 0
    detour: list[str] = []
    #: the ticks are gone (an older epoch of the pubend, whose log did not survive)
    lost: bool = False
    #: the unit whose brokers this answer is whole for (``()``: everyone — from the log)
    unit: tuple[str, ...] = ()
    #: the broker that made the answer (the pubend's, from its log; or a keeper of ``unit``,
    #: from its cache): ``hops`` counts the links from it (ges.core.provenance)
    by: str = ""
    #: the answer to a replay (:class:`Nack`)
    replay: bool = False


class AckAsk(_Msg):
    """The pubend's broker asks the brokers ``to`` how far it may release ``pubend``'s log (seed
    002 §1: log entries go once every downstream has acknowledged them): ``tick`` is its last
    committed tick. One message per link: a broker passes it on with the brokers that lie
    beyond each of its next hops, and each broker named answers with :class:`Ack` — or not at
    all while one of its subscriptions waits for its starting point. ``oldest``: the oldest
    epoch of its pubend the asker still holds (0: not said); a broker forgets its
    acknowledgements of older ones (ges.core.release)."""

    pubend: str
    to: list[str]
    tick: int
    hops: int = 0
    detour: list[str] = []
    oldest: int = 0


class Ack(_Msg):
    """Each ``(origin, tick)`` of ``acks``: ``origin`` needs none of ``pubend``'s ticks up to
    ``tick`` (at most the asked tick): its subscriptions have every one they want, or started
    after it. Relayed to the pubend's broker; a broker that passed the round's ask (``asked``,
    its tick) on gathers the answers from beyond it into one (seed 002 §2: acks consolidate
    upstream)."""

    pubend: str
    acks: list[tuple[str, int]]
    asked: int = 0
    hops: int = 0
    detour: list[str] = []


class Clocks(_Msg):
    """Leaf virtual clocks (seed 000 §3.2–3.3), flooded to every broker: each ``(broker, inc,
    seq)`` says that broker's clock has reached ``(inc, seq)``. A broker passes on only the
    entries that were news to it."""

    clocks: list[tuple[str, int, int]]


class Vector(_Msg):
    """The VT vector V_m that digest ``digest`` of ``pubend`` stands for (seed 000 §5.1): per leaf
    broker ``(broker, inc, seq, since)``, the clock the pubend knew and the first of its ticks
    it stamped with that clock. Sent on a link before the first frame of the pubend that
    carries a new digest."""

    pubend: str
    digest: int
    clocks: list[tuple[str, int, int, int]]


class ProfileWant(_Msg):
    """A keeper found its profile of ``origin`` behind an event's V_m (seed 000 §4, non-leaf
    liveness): relayed to ``origin``, which sends ``keeper`` a sync."""

    origin: str
    keeper: str
    hops: int = 0
    detour: list[str] = []


# -- client ↔ broker ---------------------------------------------------------------------------


class Subscribe(_Msg):
    """Subscribe (or replace subscription ``sub_id``) with a profile: a disjunction of
    conjunctions; an event type travels as an ``@type`` equality inside each conjunction."""

    sub_id: int
    conjunctions: list[list[Constraint]]
    profile_id: str = ""
    #: the client's number for this request, echoed by every SubAck answering it
    req: int = 0


class SubAck(_Msg):
    """The broker has the subscription (or the change, or the removal). ``complete``: every
    keeper it must reach has it too, so every matching event published from now on is
    delivered; False when the broker stopped waiting for some (they are unreachable or slow) —
    with reliable delivery the subscription then delivers only once they all have it."""

    sub_id: int
    complete: bool = True
    #: the ``req`` of the Subscribe or Unsubscribe it answers
    req: int = 0


class Unsubscribe(_Msg):
    sub_id: int
    req: int = 0


class Publish(_Msg):
    """A batch of events from one publisher; acknowledged by ``PubAck`` with the same seq.

    Idempotent publishing: with ``publisher`` (an id the publisher keeps across connections
    and restarts) and ``first`` > 0, event ``i`` of the batch is that publisher's event number
    ``first + i``. The pubend remembers the highest number it published per publisher (in its
    log, across the broker's restarts) and does not publish an event numbered at or below it
    again: a publisher that lost its connection sends again whatever it has no ``PubAck`` for,
    and nothing is published twice."""

    seq: int
    events: list[Event]
    publisher: str = ""
    first: int = 0


class PubAck(_Msg):
    """The batch is in the pubend's log: its new events at ticks ``first_tick..last_tick``
    (none when ``last_tick < first_tick``), and ``duplicates`` leading events of it that were
    published before (idempotent publishing) and were not published again.

    One acknowledgement may cover ``seqs`` consecutive publishes, ``seq - seqs + 1`` to
    ``seq`` (natural batching, ges.core.coalesce): then none had duplicates, and their events
    have the ticks in order, each publish as many as it had events."""

    seq: int
    pubend: str
    first_tick: int
    last_tick: int
    duplicates: int = 0
    seqs: int = 1


class Deliver(_Msg):
    """Events delivered to one subscription, in the order the broker received them."""

    sub_id: int
    pubend: str
    items: list[EventItem]


class StatsRequest(_Msg):
    pass


class Stats(_Msg):
    """A broker's counters; rates are computed by whoever polls twice."""

    broker: str
    incarnation: str
    clients: int
    subscriptions: int
    links_up: list[str]
    links_expected: int
    events_in: int
    events_out: int
    frames_in: int
    frames_out: int
    published: int
    delivered: int
    duplicates: int
    pid: int = 0
    #: profile entries held for the units this broker keeps (content routing), and the
    #: broker-to-broker Events frames this broker has sent
    profile_entries: int = 0
    event_frames: int = 0
    #: neighbours whose link an operator has cut at this broker (:class:`LinkControl`)
    links_cut: list[str] = []
    #: reliable delivery: events this broker's pubend log holds, and the ticks it released
    #: (every other broker acknowledged them)
    log_held: int = 0
    log_released: int = 0
    #: clients disconnected as slow consumers, and connections refused (at the cap, another
    #: network, a bad handshake), since the broker started
    slow_consumers: int = 0
    clients_refused: int = 0
    #: client requests refused for want of permission (ges.security.access)
    requests_refused: int = 0
    #: frames from peers dropped because they could not have come from their pubend's broker
    #: (ges.core.provenance)
    forged: int = 0
    #: durable sessions this broker's replicator holds (ges.core.replicator)
    sessions: int = 0
    #: reliable delivery's repair (seed 002 §2.3): nacks this broker sent, nacks it answered,
    #: events recovered by nacks, and ticks reported lost
    nacks_sent: int = 0
    nacks_answered: int = 0
    recovered: int = 0
    lost: int = 0
    #: the replicator's store: events held for its sessions (once per session that waits for
    #: one), and the last epoch it numbered
    session_events: int = 0
    session_epoch: int = 0
    #: bytes queued towards clients and towards links, not yet written; the pubend log's
    #: files' size on disk
    queued_clients: int = 0
    queued_links: int = 0
    log_bytes: int = 0
    #: one-way latency of the latest deliveries to local clients (published_at to handed
    #: over, on the two clocks), p50 and p99 in µs, when delivery records are on (0: off)
    latency_p50_us: int = 0
    latency_p99_us: int = 0
    #: the event loop of the broker's process (ges.runtime.loopclock; every broker of one
    #: process reports the same): its longest busy stretch between two waits for I/O in the
    #: last 10 s, and its busy µs since it started (their rate over two reports: utilisation)
    loop_longest_us: int = 0
    loop_busy_us: int = 0
    #: earlier epochs of this broker's pubend (it restarted) that its log still holds, not yet
    #: released to their end (ges.core.release)
    log_epochs: int = 0


class Error(_Msg):
    """The broker refused a client request; the connection stays open."""

    reason: str
    #: the request was refused for want of permission (ges.security.access)
    denied: bool = False
    #: the ``req`` of the request refused (durable sessions' requests carry one; 0: none)
    req: int = 0
    #: refused for now, for a bound on what the broker holds for everyone: ask again later
    #: (a retained ask past ges.core.retaining's bounds)
    retry: bool = False


# -- watching a network (ges.core.watch; ``ges monitor``) ----------------------------------------


class Watch(_Msg):
    """A client asks this broker for every broker's :class:`Report` each ``interval`` seconds
    for as long as it stays connected (``ges monitor``); an operator's request."""

    interval: float


class WatchLease(_Msg):
    """Broker ``root`` has clients watching: every broker is to report to it each ``interval``
    seconds until ``ttl`` seconds after it got this lease. Flooded over the links; ``hops`` is
    how far its sender is from ``root`` (its receiver is one more). A broker passes on only a
    lease newer than the last it had from ``root``: a later ``incarnation`` of it (it
    restarted), or a higher ``seq``."""

    root: str
    incarnation: int
    seq: int
    interval: float
    ttl: float
    hops: int = 0


class LogLine(msgspec.Struct, array_like=True, frozen=True):
    """A line a broker logged (info or warning): when (seconds since the epoch, its clock),
    how bad, what."""

    at: float
    level: str
    text: str


class Reported(msgspec.Struct, array_like=True, frozen=True):
    """One broker's report: its counters, and the lines it logged since its last report
    (``missed``: lines not here, over the bound)."""

    stats: Stats
    lines: list[LogLine] = []
    missed: int = 0


class Carried(msgspec.Struct, array_like=True, frozen=True):
    """Broker ``broker``'s report as it travels: a :class:`Reported`, encoded once by that
    broker; the brokers it passes do not decode it (:func:`carry`, :func:`opened`)."""

    broker: str
    body: msgspec.Raw


class Report(_Msg):
    """Reports of brokers for watching broker ``to``, gathered on their way (each broker sends
    its own with those it has gathered since its last) and relayed hop by hop; the watching
    broker hands them as they are to its watching clients."""

    to: str
    items: list[Carried]
    hops: int = 0
    detour: list[str] = []


_reported = msgspec.msgpack.Decoder(Reported)


def carry(report: Reported) -> Carried:
    """A broker's report, encoded to travel."""
    return Carried(report.stats.broker, msgspec.Raw(msgspec.msgpack.encode(report)))


def opened(item: Carried) -> Reported:
    """A report as it left its broker.

    Raises:
        FrameError: it does not decode, or names another broker than it travels as.
    """
    try:
        report = _reported.decode(item.body)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise FrameError(f"bad report of {item.broker!r}: {exc}") from None
    if report.stats.broker != item.broker:
        raise FrameError(f"a report of {report.stats.broker!r} carried as {item.broker!r}")
    return report


# -- operator ↔ broker (client protocol) -------------------------------------------------------


class LinkControl(_Msg):
    """Cut (``up=False``) or restore (``up=True``) this broker's link to its neighbour ``peer``.

    While a link is cut its broker closes any open connection to ``peer`` (the core sees the link
    go down as after a TCP failure), does not dial it and refuses its ``Hello``. Cut state is
    soft: a restarted broker has every link restored. Answered by :class:`LinkControlled`, or by
    :class:`Error` for a ``peer`` that is not a neighbour.
    """

    peer: str
    up: bool


class LinkControlled(_Msg):
    """A :class:`LinkControl` was applied; ``changed`` is False if the link was already so."""

    peer: str
    up: bool
    changed: bool


# -- durable sessions (ges.core.replicator, ges.runtime.sessions) -------------------------------


class SessionSub(msgspec.Struct, array_like=True, frozen=True):
    """One subscription of a durable session: its number in the session, the profile's id,
    and the profile (a disjunction of conjunctions, as in :class:`Subscribe`)."""

    sub_id: int
    profile_id: str
    conjunctions: list[list[Constraint]]


class SessionOpen(_Msg):
    """Open, resume or take over the durable session ``name`` (client → its broker; the broker
    passes it to the session's replicator with ``owner``, ``operator`` and ``at`` filled in).

    ``subs`` None keeps the stored subscriptions; given, they replace them (a changed profile
    keeps ``Client.change``'s guarantee). The resume token is ``replicator``, ``store`` and
    ``epoch``: the replicator holding the session, its store's id, and the last epoch the
    client has (-1: none — resume after the last one the session acknowledged)."""

    name: str
    subs: list[SessionSub] | None = None
    replicator: str = ""
    store: str = ""
    epoch: int = -1
    #: broker → replicator: create it if it does not exist (else: an Error saying so)
    create: bool = True
    owner: str = ""
    operator: bool = False
    at: str = ""
    req: int = 0
    #: its own retention limits from now on: events held at most, their age in seconds at
    #: most (0: keep what it had; the topology's ``sessions:`` if never set)
    max_events: int = 0
    max_age: float = 0.0
    #: with ``subs`` None: the subscriptions to make it with if it does not exist yet (what a
    #: plain subscribe would have), or why its client may not have them (its broker checks)
    fallback: list[SessionSub] | None = None
    fallback_refused: str = ""
    #: how long it outlives its client's leaving, in seconds, from now on (0: as the topology's
    #: ``sessions.expire_after`` says; None: as it was) — an MQTT 5.0 client's Session Expiry
    #: Interval
    expiry: float | None = None
    #: it ends as this client leaves, however that comes about: its connection closed, its
    #: broker's follow connection lost (an MQTT 5.0 client that resumed it without Clean Start
    #: and with no Session Expiry Interval, §3.1.2.11.2)
    ends: bool = False


class SessionOpened(_Msg):
    """The session is open on this connection: deliveries follow from epoch ``start`` + 1 on;
    ``backlog`` of them were stored before it was opened (catch-up)."""

    name: str
    replicator: str
    store: str
    created: bool
    start: int
    backlog: int
    subs: list[tuple[int, str]]
    req: int = 0
    #: each subscription's profile, in the order of ``subs`` (a client that keeps no copy of
    #: them — an MQTT client's persistent session — learns them back)
    profiles: list[list[list[Constraint]]] = []
    #: the last epoch among the ``backlog`` stored for it (0: none)
    last: int = 0
    #: the QoS 2 packet identifiers its MQTT client published and has not released, and the
    #: epochs of deliveries it acknowledged whose PUBCOMP has not come (``SessionState.rel``)
    qos2: list[int] = []
    rel: list[int] = []
    #: the last epoch streamed to its client before (this replicator's count): a delivery up
    #: to it may have begun, so it goes again whatever its Message Expiry says (§3.3.2.3.3)
    sent: int = 0


class SessionItem(msgspec.Struct, array_like=True, frozen=True, gc=False):
    """A stored event of a session: its epoch at the replicator, its pubend and position, and
    the session's subscriptions it matched."""

    epoch: int
    pubend: str
    item: EventItem
    subs: list[int]
    #: a gap notice instead of an event: the ticks ``item.tick..gap_to`` of the pubend may have
    #: held events for the session that are gone, and why (its item's event is empty)
    gap_to: int = 0
    why: str = ""


class SessionEvents(_Msg):
    """Events of session ``name`` in epoch order (replicator → broker → client)."""

    name: str
    items: list[SessionItem]


class SessionAck(_Msg):
    """The client has every event of session ``name`` up to ``epoch`` (client → broker →
    replicator); the replicator keeps it as the session's resume point. With ``req``, answered
    by :class:`SessionKept` once it is durable: a client that stops after it, to come back
    without its token, knows that the session resumes after it even if the replicator dies
    at once."""

    name: str
    epoch: int
    req: int = 0


class SessionQos2(_Msg):
    """Session ``name``'s MQTT client published QoS 2 messages with the packet identifiers
    ``add`` and released those in ``drop`` (client's broker → replicator, from the session's
    follower only). With ``req``, answered by :class:`SessionKept` once the change is durable:
    then the client is told (PUBREC), and a PUBLISH it sends again with one of them, at any
    broker, is acknowledged and not published twice (MQTT 3.1.1 §4.3.3). Likewise the epochs of
    the deliveries it acknowledged with PUBREC (``rel_add``: PUBREL goes once that is kept, and
    a broker it reconnects at sends PUBREL again, not the message, §4.4) and completed
    (``rel_drop``, PUBCOMP). ``whole``: ``add`` and ``rel_add`` are all it holds (a session
    opened at the replicator it was handed over to)."""

    name: str
    add: list[int] = []
    drop: list[int] = []
    req: int = 0
    rel_add: list[int] = []
    rel_drop: list[int] = []
    whole: bool = False


class SessionKept(_Msg):
    """The change ``req`` of session ``name``'s QoS 2 identifiers, or its acknowledgement
    ``req``, is durable."""

    name: str
    req: int = 0


class SessionLeave(_Msg):
    """The client of session ``name`` left its broker (broker → replicator): the session stays,
    and keeps what is published for it — as long as ``expiry`` says from now on (as
    ``SessionOpen.expiry``; None: as it was), or not at all with ``end`` (an MQTT 5.0 client's
    DISCONNECT with a Session Expiry Interval, §3.14.2.2.2; client → its broker first). An
    MQTT 5.0 client's ``will`` is published ``will_delay`` seconds later unless the session is
    opened again first, or at once if the session ends first (§3.1.3.2.2)."""

    name: str
    expiry: float | None = None
    end: bool = False
    will: Event | None = None
    will_delay: float = 0.0
    #: its client is back on another connection of the same broker (an MQTT takeover): the
    #: session outlives this one, even if it was opened to end with it (``SessionOpen.ends``)
    back: bool = False


class SessionClosed(_Msg):
    """Session ``name`` no longer delivers on this connection: taken over by a connection
    elsewhere, moved by an operator (``to``: the broker to resume at), ended, or its
    replicator is unreachable (``retry``: open it again later)."""

    name: str
    reason: str
    to: str = ""
    ended: bool = False
    retry: bool = False
    #: open it again at this replicator (it was handed over there, or is being handed over
    #: from there)
    replicator: str = ""
    #: the open it answers, if it answers one (0: it tells the session's holder)
    req: int = 0


class RetainedAsk(_Msg):
    """What is retained on these MQTT topic filters (a subscriber's broker → a replicator,
    ges.durable.retained)."""

    filters: list[str]
    req: int = 0


class Retained(_Msg):
    """The retained messages on the filters asked, each once; ``complete`` False: more are
    retained than one answer carries."""

    events: list[Event]
    complete: bool = True
    req: int = 0


class Handover(_Msg):
    """Replicator ``source`` hands durable session ``name`` over to replicator ``to``, the one
    of the unit its client is now in (seed 004 §4's delegation; relayed hop by hop). ``cuts``:
    per pubend, the tick up to which ``source`` keeps what the session wants — ``to`` reads
    the rest from each pubend's log. ``hid`` names this hand-over."""

    to: str
    source: str
    hid: str
    name: str
    owner: str
    created: float
    subs: list[SessionSub]
    cuts: dict[str, int]
    max_events: int = 0
    max_age: float = 0.0
    hops: int = 0
    detour: list[str] = []
    #: the session's QoS 2 identifiers held (``SessionQos2``)
    qos2: list[int] = []
    rel: list[int] = []
    #: its Session Expiry Interval (``SessionState.expiry``)
    expiry: float = 0.0


class HandoverNote(_Msg):
    """A step of hand-over ``hid`` of session ``name`` between replicators (relayed hop by
    hop): ``taken`` (``to`` → ``source``: it stores everything after the cuts), ``refused``
    (with ``why``), ``poll`` (may it serve the session yet?), ``released`` (the old
    replicator's part was delivered: it may), ``done``, ``abandon``."""

    to: str
    source: str
    hid: str
    name: str
    what: str
    why: str = ""
    hops: int = 0
    detour: list[str] = []


class SessionControl(_Msg):
    """Operator's request about sessions, answered by :class:`SessionList` (or ``Error``):
    ``list`` (every session of this replicator, or ``name``), ``end`` (end ``name`` and free
    what it holds), ``roam`` (move ``name``'s client to broker ``to``); ``discard`` (client →
    its broker: end ``name`` if it exists and is the client's — an MQTT clean session's
    CONNECT, §3.1.2.4 — answered by a ``SessionList`` either way)."""

    action: str
    name: str = ""
    to: str = ""
    req: int = 0
    #: broker → replicator, ending a session for a client: who the client is
    owner: str = ""
    operator: bool = False


class SessionInfo(msgspec.Struct, array_like=True, frozen=True):
    """One durable session as its replicator sees it."""

    name: str
    owner: str
    replicator: str
    #: the broker its client is connected at ('' when none), and for how many seconds it has
    #: been connected there (or disconnected)
    at: str
    for_s: float
    subs: list[tuple[int, str, str]]
    #: the last epoch acknowledged, the last stored for it, and how many are held for it
    acked: int
    last: int
    held: int
    created: float
    #: events retention let go of for it, and whether it has been disconnected for longer
    #: than its age limit (nobody resumes it)
    dropped: int = 0
    stale: bool = False
    #: a hand-over between replicators in progress (ges.core.handover): "to B" at the
    #: replicator handing it over, "from B" at the one taking it, "moved to B" once handed
    handover: str = ""


class SessionList(_Msg):
    sessions: list[SessionInfo]
    req: int = 0


Message = (
    Hello
    | Welcome
    | Refuse
    | Heartbeat
    | Bye
    | Connectivity
    | Events
    | Silence
    | Nack
    | Recovered
    | AckAsk
    | Ack
    | Profiles
    | ProfileAck
    | Clocks
    | Vector
    | ProfileWant
    | Subscribe
    | SubAck
    | Unsubscribe
    | Publish
    | PubAck
    | Deliver
    | StatsRequest
    | Stats
    | Error
    | LinkControl
    | LinkControlled
    | SessionOpen
    | SessionOpened
    | SessionEvents
    | SessionAck
    | SessionQos2
    | SessionKept
    | SessionLeave
    | SessionClosed
    | SessionControl
    | SessionList
    | RetainedAsk
    | Retained
    | Handover
    | HandoverNote
    | Watch
    | WatchLease
    | Report
)

_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(Message)

#: Room a frame leaves around one event: what a forwarded copy adds to it (its tick, routes
#: and path, the frame's other fields), with a wide margin. An event — attributes and payload,
#: as encoded — may be at most DEFAULT_MAX_FRAME minus this, so every frame that carries it fits.
EVENT_HEADROOM = 256 * 1024
MAX_EVENT_BYTES = DEFAULT_MAX_FRAME - EVENT_HEADROOM


class FrameTooLarge(ValueError):
    """A message that cannot be split into frames within the limit (an event over
    MAX_EVENT_BYTES, or one of the few messages that are never split)."""


def encode(message: _Msg) -> bytes:
    """One complete frame carrying ``message`` (no size check: see :func:`encode_frames`)."""
    return frame(_encoder.encode(message))


def encode_frames(message: _Msg, *, max_frame: int = DEFAULT_MAX_FRAME) -> list[bytes]:
    """``message`` as frames of at most ``max_frame`` body bytes each — the limit every receiver
    enforces. A message too large for one frame is split along the list it carries (events,
    answers, profile changes, link states, clocks, acknowledgements) into messages that mean the
    same together; an answer is split into answers for consecutive tick ranges.

    Raises:
        FrameTooLarge: a single event, or a message that is never split, is over the limit.
    """
    data = encode(message)
    if len(data) - HEADER_SIZE <= max_frame:
        return [data]
    parts = _halves(message)
    if parts is None:
        raise FrameTooLarge(
            f"{type(message).__name__} of {len(data) - HEADER_SIZE} bytes is over the "
            f"{max_frame}-byte frame limit and cannot be split"
        )
    return [f for part in parts for f in encode_frames(part, max_frame=max_frame)]


def _halves(message: _Msg) -> list[_Msg] | None:
    """``message`` as two messages meaning the same together; None if it cannot be split."""
    replace = msgspec.structs.replace
    kind = type(message)
    if kind is Recovered:
        items = message.items
        if len(items) < 2:
            return None
        half = len(items) // 2
        cut = items[half - 1].tick  # every tick of the range is in exactly one of the answers
        return [
            replace(message, items=items[:half], hi=cut),
            replace(message, items=items[half:], lo=cut + 1),
        ]
    field = _SPLIT_BY.get(kind)
    if field is None:
        return None
    values = getattr(message, field)
    if len(values) < 2:
        return None
    half = len(values) // 2
    return [replace(message, **{field: values[:half]}), replace(message, **{field: values[half:]})]


#: Messages that carry a list they can be split by, and its field.
_SPLIT_BY = {
    Deliver: "items",
    Events: "items",
    Profiles: "changes",
    Connectivity: "reports",
    Clocks: "clocks",
    Ack: "acks",
    SessionEvents: "items",
    SessionList: "sessions",
}


def event_size(event: Event) -> int:
    """About how many bytes ``event`` takes encoded (within a few per attribute): what bounds
    on held events count."""
    size = 16 + len(event.payload)
    for name, value in event.attributes.items():
        size += len(name) + (len(value) if type(value) is str else 9) + 2
    return size


def held_size(value) -> int:
    """The bytes a held event, or event item, counts against a bound (:func:`event_size`); a
    nominal 64 for anything else (tests hold plain values)."""
    kind = type(value)
    if kind is EventItem:
        return event_size(value.event)
    if kind is Event:
        return event_size(value)
    return 64


def decode(body) -> Message:
    """Decode one frame body; an undecodable body raises :class:`FrameError`, and so does a
    ``Publish`` carrying an event over MAX_EVENT_BYTES (checked only when the frame itself is
    that large, so ordinary frames cost nothing more)."""
    try:
        message = _decoder.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as exc:
        raise FrameError(f"undecodable frame: {exc}") from None
    if len(body) > MAX_EVENT_BYTES and type(message) is Publish:
        for i, event in enumerate(message.events):
            size = len(_encoder.encode(event))
            if size > MAX_EVENT_BYTES:
                raise FrameError(
                    f"event {i} of a publish is {size} bytes, over the {MAX_EVENT_BYTES}-byte "
                    "event limit"
                )
    return message
