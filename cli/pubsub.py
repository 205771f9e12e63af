"""``ges publish`` and ``ges subscribe``: a client at one broker, named by id."""

from __future__ import annotations

import base64
import json
import math
import signal
import sys
import time
from pathlib import Path

import trio
import typer

from cli._common import (
    CERTS,
    INSECURE,
    client_auth,
    err,
    load_topology,
    network_certs,
    one_line_errors,
    out,
    parse_tags,
    resolve_broker,
    write_out,
)
from ges.client import KEPT_WAIT, DurableSession, Move, connect
from ges.core.publishing import MAX_PUBLISHER_ID
from ges.durable import session_name_problem
from ges.errors import OperationError, PermissionDenied, UserInputError
from ges.matching.model import TOPIC_ATTR, TYPE_ATTR, Conjunction, Profile, profile_to_wire
from ges.matching.syntax import parse_attr, parse_where
from ges.matching.topics import check_topic
from ges.matching.xml import load_event, load_profile
from ges.records import RecordWriter, SessionDelivery
from ges.topology import parse_duration
from ges.wire import MAX_EVENT_BYTES, event_size
from ges.wire import messages as m

#: Events per Publish frame when publishing as fast as possible.
PUBLISH_BATCH = 256
FORMATS = ("text", "jsonl")


def publish(
    topology_file: Path = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY"),
    broker: str = typer.Option(..., "--broker", "-b", help="Broker id to publish at."),
    attr: list[str] = typer.Option(
        [],
        "--attr",
        "-a",
        help="name=value (true/false, else int, else float, else string); name:str=value forces a string (also :int :float :bool).",
    ),
    count: int = typer.Option(
        1, "--count", "-n", help="Events to publish; each gets int attribute n=START..START+N-1."
    ),
    start: int = typer.Option(0, "--start", help="The n of the first event (default 0)."),
    client: str = typer.Option(
        None,
        "--client",
        help="Publish idempotently as NAME: event n is NAME's event number n+1, and one the "
        "broker already published is not published again — run the same command again after a "
        "failure and only what was not acknowledged goes out. Over TLS it is also who the "
        "client is: clients/NAME.crt of the certificate directory, or the token in GES_TOKEN.",
    ),
    rate: float = typer.Option(
        0.0, "--rate", "-r", help="Events per second (0: as fast as possible)."
    ),
    size: int = typer.Option(0, "--size", help="Payload bytes per event."),
    payload: str = typer.Option(None, "--payload", help="Payload text (instead of --size filler)."),
    event_type: str = typer.Option(None, "--type", help="Event type (profiles may require one)."),
    topic: str = typer.Option(
        None,
        "--topic",
        help="An MQTT topic (the @topic attribute): MQTT clients whose filters match it get "
        "the events, and so do profiles with '@topic topic FILTER'.",
    ),
    event_file: Path = typer.Option(
        None,
        "--event",
        "-e",
        help="An XML event (schemas/event.xsd): its type, attributes and payload; --attr, --type, --payload and --size override them.",
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON summary on stdout."),
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Publish events at a broker; returns once the broker acknowledged every one.

    On success and on failure it says how many events the broker acknowledged; with --client
    the unacknowledged ones can be sent again without any being published twice.
    """
    one_line_errors(_publish)(
        topology_file,
        broker,
        attr,
        count,
        start,
        client,
        rate,
        size,
        payload,
        event_type,
        event_file,
        as_json,
        certs,
        insecure,
        topic,
    )


def _publish(
    topology_file,
    broker,
    attrs_,
    count,
    start,
    client_name,
    rate,
    size,
    payload,
    event_type,
    event_file,
    as_json,
    certs=None,
    insecure=False,
    topic=None,
) -> None:
    topology = load_topology(topology_file)
    resolve_broker(topology, broker)
    if topic is not None and (why := check_topic(topic)) is not None:
        raise UserInputError(f"--topic {topic!r}: {why}")
    if count < 1:
        raise UserInputError(f"--count {count}: must be at least 1")
    if start < 0:
        raise UserInputError(f"--start {start}: must be ≥ 0")
    if rate < 0:
        raise UserInputError(f"--rate {rate}: must be ≥ 0")
    if size < 0:
        raise UserInputError(f"--size {size}: must be ≥ 0")
    if client_name is not None and not 0 < len(client_name) <= MAX_PUBLISHER_ID:
        raise UserInputError(f"--client: a name of 1 to {MAX_PUBLISHER_ID} characters")
    attributes: dict = {}
    body = b"x" * size
    if event_file is not None:
        doc = load_event(event_file)
        attributes = doc.wire_attributes()
        if payload is None and not size:
            body = doc.payload
    attributes.update(parse_attr(a) for a in attrs_)
    if event_type is not None:
        if not event_type:
            raise UserInputError("--type: must not be empty")
        attributes[TYPE_ATTR] = event_type
    if topic is not None:
        attributes[TOPIC_ATTR] = topic
    if payload is not None:
        body = payload.encode()
    biggest = m.Event({**attributes, "n": start + count - 1}, body, time.time_ns())
    if event_size(biggest) > MAX_EVENT_BYTES - 1024:
        raise UserInputError(
            f"an event of {event_size(biggest)} bytes (attributes and payload) is over the "
            f"{MAX_EVENT_BYTES}-byte limit of one event"
        )
    auth = client_auth(network_certs(topology, certs, insecure), client_name)
    spec = topology.brokers[broker]
    failure: OperationError | None = None
    done = {"acknowledged": 0, "duplicates": 0}

    async def main():
        nonlocal failure
        async with connect(
            spec.host, spec.port, topology=topology, client_id=client_name, **auth.connect_args()
        ) as client:

            def make(i: int) -> m.Event:
                attrs_i = dict(attributes)
                attrs_i.setdefault("n", i)
                return m.Event(attrs_i, body, time.time_ns())

            async def send(lo: int, hi: int):
                first = lo + 1 if client_name is not None else None
                await client.publish_nowait([make(i) for i in range(lo, hi)], first=first)

            try:
                end = start + count
                if rate <= 0:
                    for lo in range(start, end, PUBLISH_BATCH):
                        await send(lo, min(end, lo + PUBLISH_BATCH))
                else:
                    t0 = trio.current_time()
                    i = start
                    while i < end:
                        due = min(end, start + int((trio.current_time() - t0) * rate) + 1)
                        if due > i:
                            await send(i, due)
                            i = due
                        else:
                            await trio.sleep_until(t0 + (i - start) / rate)
                await client.flush()
            except OperationError as exc:
                failure = exc
            finally:
                done["acknowledged"] = client.acknowledged
                done["duplicates"] = client.duplicates

    started = time.perf_counter()
    try:
        trio.run(main)
    except OperationError as exc:  # could not connect at all
        failure = exc
    elapsed = time.perf_counter() - started
    acked, duplicates = done["acknowledged"], done["duplicates"]
    summary = {
        "broker": broker,
        "requested": count,
        "acknowledged": acked,
        "published": acked - duplicates,
        "duplicates": duplicates,
        "first_unacknowledged": start + acked if acked < count else None,
        "client": client_name,
        "seconds": round(elapsed, 4),
        "events_per_second": round(acked / elapsed, 1) if elapsed > 0 else None,
    }
    if failure is not None:
        summary["error"] = str(failure)
    if as_json:
        out.print_json(json.dumps(summary))
    if isinstance(failure, PermissionDenied):  # sending again would be refused again
        raise PermissionDenied(f"{failure}; {summary['acknowledged']} of {count} acknowledged")
    if failure is not None:
        raise OperationError(f"{failure}; {_acknowledged(summary, start, client_name)}")
    if not as_json:
        before = f" ({duplicates} of them published before, not again)" if duplicates else ""
        err.print(
            f"published {count} events at {broker} in {elapsed:.3f}s{before}", highlight=False
        )


def _acknowledged(summary: dict, start: int, client_name: str | None) -> str:
    """What a failed publish says about what the broker has: how many events it acknowledged
    and how to send the rest."""
    acked, count = summary["acknowledged"], summary["requested"]
    got = f"n = {start}..{start + acked - 1}" if acked else "none"
    rest = f"n = {start + acked}..{start + count - 1}"
    if client_name is not None:
        how = f"run the same command again: with --client {client_name} none is published twice"
    else:
        how = (
            "with --client NAME they can be sent again without being published twice "
            f"(--start {start + acked} --count {count - acked})"
        )
    return f"{acked} of {count} events acknowledged ({got}); {rest} were not: {how}"


def subscribe(
    topology_file: Path = typer.Argument(..., help="Topology YAML file.", metavar="TOPOLOGY"),
    broker: str = typer.Option(..., "--broker", "-b", help="Broker id to subscribe at."),
    where: list[str] = typer.Option(
        [],
        "--where",
        "-w",
        help="'name OP value' (OP: = != < <= > >= prefix in) or 'name exists'; repeat to AND.",
    ),
    count: int = typer.Option(
        0, "--count", "-n", help="Exit 0 after this many events (0: run until timeout or Ctrl-C)."
    ),
    timeout: float = typer.Option(
        0.0, "--timeout", "-t", help="Seconds to wait; with --count, exit 1 if fewer arrived."
    ),
    profile_file: Path = typer.Option(
        None,
        "--profile",
        "-p",
        help="An XML profile (schemas/profile.xsd); --where constraints are added to each of its conjunctions.",
    ),
    fmt: str = typer.Option("text", "--format", "-f", help="text or jsonl."),
    record: Path = typer.Option(
        None, "--record", help="Append delivery records (JSON lines) to FILE."
    ),
    tag: list[str] = typer.Option(
        [], "--tag", help="KEY=VALUE experiment tag for the delivery records (repeatable)."
    ),
    client: str = typer.Option(
        None,
        "--client",
        help="Open (or resume) the durable session NAME, connecting as client NAME (its "
        "certificate clients/NAME.crt, or the token in GES_TOKEN; else the admin certificate): "
        "what is published while it is away is kept for it, and it resumes at any broker. "
        "Without --where/--profile it keeps its stored profile.",
        metavar="NAME",
    ),
    max_held: int = typer.Option(
        0,
        "--max-held",
        help="With --client: the most events its replicator keeps for the session while it is "
        "away (0: the topology's sessions: max_events, default 1,000,000).",
    ),
    max_age: str = typer.Option(
        "",
        "--max-age",
        help="With --client: the oldest an event kept for it may get, as seconds or 30s, 15m, "
        "12h, 7d ('': the topology's, default 7d).",
    ),
    certs: Path = CERTS,
    insecure: bool = INSECURE,
) -> None:
    """Subscribe at a broker and print every matching event as it arrives.

    With --client NAME the subscription is the durable session NAME: it outlives this command
    (and its broker), every matching event published meanwhile is kept by the session's
    replicator, and running this again at any broker resumes it with exactly what it missed.
    A line on stderr says each time it opens, resumes or moves (`ges roam`, or its broker
    failing)."""
    one_line_errors(_subscribe)(
        topology_file,
        broker,
        where,
        profile_file,
        count,
        timeout,
        fmt,
        record,
        tag,
        certs,
        insecure,
        client,
        max_held,
        max_age,
    )


def _subscribe(
    topology_file,
    broker,
    where,
    profile_file,
    count,
    timeout,
    fmt,
    record,
    tag=(),
    certs=None,
    insecure=False,
    client=None,
    max_held=0,
    max_age="",
) -> None:
    tags = parse_tags(tag)
    topology = load_topology(topology_file)
    resolve_broker(topology, broker)
    if fmt not in FORMATS:
        raise UserInputError(f"--format {fmt!r}: must be one of {', '.join(FORMATS)}")
    if count < 0:
        raise UserInputError(f"--count {count}: must be ≥ 0")
    if timeout < 0:
        raise UserInputError(f"--timeout {timeout}: must be ≥ 0")
    constraints = [parse_where(w) for w in where]
    profile = load_profile(profile_file) if profile_file is not None else Profile("cli")
    try:
        profile = Profile(
            profile.id,
            tuple(Conjunction((*c.constraints, *constraints)) for c in profile.conjunctions),
            profile.event_type,
        )
    except ValueError as exc:
        raise UserInputError(f"--where: {exc}") from None
    spec = topology.brokers[broker]
    record_file = None
    if record is not None:
        try:
            record_file = open(record, "a", encoding="utf-8")  # noqa: SIM115 - closed below
        except OSError as exc:
            raise UserInputError(f"--record {record}: cannot open: {exc.strerror}") from None
    auth = client_auth(network_certs(topology, certs, insecure), client)
    client_name = client or f"subscribe-{broker}-{time.time_ns()}"
    received = 0
    session_name = client
    if client:
        why = session_name_problem(client)
        if why is not None:
            raise UserInputError(f"--client: {why}")
        if max_held < 0:
            raise UserInputError(f"--max-held {max_held}: must be ≥ 0")
        age = parse_duration(max_age) if max_age else 0.0
        if age is None:
            raise UserInputError(f"--max-age {max_age!r}: give seconds, or like 30s, 15m, 12h, 7d")
        subs = (
            [m.SessionSub(1, profile.id, profile_to_wire(profile))]
            if where or profile_file is not None
            else None
        )

    async def main():
        nonlocal received
        writer = (
            RecordWriter(record_file, subscriber_broker=broker, client=client_name, tags=tags)
            if record_file
            else None
        )
        stdout = sys.stdout
        shown = [-1]  # the epoch of the last delivery printed (durable sessions)

        def show(batch) -> bool:
            """Print a batch (and record it); True once --count events have come. A durable
            session's gap notice is a line of its own (stderr in text, an object in jsonl).
            Only a batch that is out is taken as shown (the session acknowledges it)."""
            nonlocal received
            if count:  # what is printed and acknowledged: up to --count events, gaps included
                n = 0
                for i, d in enumerate(batch):
                    n += not getattr(d, "gap_to", 0)
                    if received + n >= count:
                        batch = batch[: i + 1]
                        break
            last = batch[-1].epoch if batch and isinstance(batch[-1], SessionDelivery) else None
            if any(getattr(d, "gap_to", 0) for d in batch):
                for d in batch:
                    if d.gap_to:
                        _say_gap(d, fmt, stdout)
                batch = [d for d in batch if not getattr(d, "gap_to", 0)]
            if batch:
                write_out(stdout, "\n".join(_format(d, fmt) for d in batch) + "\n")
            if last is not None:  # only what is out is acknowledged
                shown[0] = last
            if not batch:
                return False
            if writer:
                writer.write(batch)
            received += len(batch)
            return bool(count) and received >= count

        if session_name:
            session = DurableSession(
                topology,
                session_name,
                broker,
                subs,
                connect_args=lambda b: auth.connect_args(),
                on_move=_say_moved,
                max_events=max_held,
                max_age=age,
                # a new session without --where/--profile: everything, as a plain subscribe
                fallback=[m.SessionSub(1, profile.id, profile_to_wire(profile))],
            )
            async with session.running():
                try:
                    async for batch in session.batches():
                        if show(batch):
                            return True
                finally:  # what was printed is had, however this ends (--count, --timeout, ^C)
                    kept = False
                    with trio.CancelScope(shield=True), trio.move_on_after(KEPT_WAIT):
                        kept = await session.ack(shown[0], kept=True) is not False
                    if not kept:
                        err.print(
                            f"warning: durable session {session_name}: its replicator did not "
                            f"confirm within {KEPT_WAIT:g} s that it kept the acknowledgement "
                            "of what was printed; some of it may come again",
                            highlight=False,
                        )
            return None
        async with connect(
            spec.host, spec.port, topology=topology, client_id=client_name, **auth.connect_args()
        ) as client:
            sub = await client.subscribe(profile)
            shown = str(profile)
            err.print(f"subscribed at {broker} to {shown}", highlight=False)
            if not sub.complete:
                err.print(
                    f"warning: not every keeper of {broker}'s units has the subscription yet "
                    "(some are unreachable); events routed through them reach it once they do",
                    highlight=False,
                )
            async for batch in sub.batches():
                if show(batch):
                    return True
            why = client.closed_reason or "it ended the subscription"
            raise OperationError(
                f"broker {broker} closed the subscription after {received} events: {why}"
            )

    try:
        result = trio.run(_until_signalled, main, timeout)
    finally:
        if record_file:
            record_file.close()
    if result is None and count:
        raise OperationError(f"timeout after {timeout:g}s: received {received} of {count} events")


async def _until_signalled(fn, seconds: float):
    """Run ``fn`` (for at most ``seconds``, if not 0); None if the time ran out.

    SIGINT (^C) and SIGTERM cancel it at its next checkpoint, and then raise KeyboardInterrupt
    (exit 130): not trio's KeyboardInterrupt at whatever line is running, which can land
    between a durable session's batch being taken as acknowledged and its acknowledgement
    being sent, so that the next resume repeats the batch."""
    result = signalled = None
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal signalled
            with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                async for signum in signals:
                    signalled = signum
                    nursery.cancel_scope.cancel()
                    return

        nursery.start_soon(watch)
        with trio.move_on_after(seconds or math.inf):
            result = await fn()
        nursery.cancel_scope.cancel()
    if signalled is not None:
        raise KeyboardInterrupt
    return result


def _payload_json(payload: bytes) -> tuple[str, str]:
    try:
        return payload.decode("utf-8"), "utf-8"
    except UnicodeDecodeError:
        return base64.b64encode(payload).decode("ascii"), "base64"


def _say_gap(d, fmt: str, stdout) -> None:
    """A durable session's gap notice: nothing is let go silently."""
    if fmt == "jsonl":
        gap = {"pubend": d.pubend, "from": d.tick, "to": d.gap_to, "why": d.why, "epoch": d.epoch}
        write_out(stdout, json.dumps({"gap": gap}, separators=(",", ":")) + "\n")
    else:
        err.print(f"gap: {d.pubend} ticks {d.tick}..{d.gap_to}: {d.why}", highlight=False)


def _say_moved(move: Move) -> None:
    """A line on stderr each time a durable session opens, resumes or moves."""
    caught = f"{move.replayed:,} missed events replayed"
    if move.frm and move.frm == move.to:  # the same broker: its session moved (a hand-over)
        text = f"{move.why}: resumed at {move.to}, {caught}"
    elif move.frm:
        text = f"roamed {move.frm} -> {move.to}: {caught} ({move.why})"
    elif move.created:
        text = f"opened durable session at {move.to}"
    else:
        text = f"resumed durable session at {move.to}: {caught}"
    err.print(text, highlight=False)


def _format(d, fmt: str) -> str:
    if fmt == "jsonl":
        text, enc = _payload_json(d.event.payload)
        obj = {
            "pubend": d.pubend,
            "tick": d.tick,
            "attributes": d.event.attributes,
            "payload": text,
            "payload_encoding": enc,
            "published_at": d.event.published_at,
            "received_at": d.received_at,
            "hops": d.hops,
        }
        if isinstance(d, SessionDelivery):
            obj["epoch"] = d.epoch
        return json.dumps(obj, separators=(",", ":"))
    attrs_text = " ".join(f"{k}={v!r}" for k, v in d.event.attributes.items())
    latency_us = (d.received_at - d.event.published_at) / 1000 if d.event.published_at else 0
    size = len(d.event.payload)
    return (
        f"{d.pubend}#{d.tick} {attrs_text} ({size} B payload, {d.hops} hops, {latency_us:.0f} µs)"
    )
