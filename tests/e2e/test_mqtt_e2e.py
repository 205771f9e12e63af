"""MQTT clients against ``ges up`` (issue 23): paho-mqtt and mosquitto's own command-line
clients, over TLS with the network's certificates as ``ges up`` makes them, publishing at one
broker and subscribing at another across super-super-clusters with wildcards; GES's own
clients on the same events; identities and permissions; what ends an MQTT connection."""

from __future__ import annotations

import json
import os
import queue
import shutil
import signal
import socket
import ssl
import struct
import subprocess
import threading
import time

import paho.mqtt.client as mqtt
import pytest
import yaml

from ges.mqtt import packets as p
from ges.mqtt.frames import PacketReader
from ges.runtime.ports import on_free_ports
from ges.runtime.sessions import DISCARD_WAIT
from ges.security.certs import CertDir
from tests.e2e.test_up_e2e import GES, ROOT, Up, ges


@pytest.fixture(scope="module")
def mosquitto_clients() -> str:
    """mosquitto_sub's path: the Debian package mosquitto-clients, installed if missing."""
    found = shutil.which("mosquitto_sub")
    if found is None:
        for cmd in (
            ["apt-get", "install", "-y", "-q", "mosquitto-clients"],
            ["apt-get", "update", "-q"],
            ["apt-get", "install", "-y", "-q", "mosquitto-clients"],
        ):
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if cmd[1] == "install" and done.returncode == 0:
                break
        found = shutil.which("mosquitto_sub")
        if found is None:
            pytest.fail(f"could not install mosquitto-clients: {done.stderr[-500:]}")
    return found


def demo_with_mqtt(tmp_path, websocket=(), **sessions):
    """demo.yaml on free ports, and its brokers' MQTT ports (the brokers ``websocket`` names
    serve MQTT over WebSocket too: their ports under ``(bid, "ws")``)."""
    data = yaml.safe_load((ROOT / "topologies" / "demo.yaml").read_text())
    if sessions:
        data["sessions"] = sessions
    assert all("mqtt_port" in b for b in data["brokers"].values())
    for bid in websocket:
        data["brokers"][bid]["mqtt_ws_port"] = 1
    data = on_free_ports(data)
    path = tmp_path / "demo.yaml"
    path.write_text(yaml.safe_dump(data))
    ports = {bid: spec["mqtt_port"] for bid, spec in data["brokers"].items()}
    ports |= {(bid, "ws"): data["brokers"][bid]["mqtt_ws_port"] for bid in websocket}
    return path, ports


class Paho:
    """A paho-mqtt client on its own thread; what it receives goes to ``messages``."""

    def __init__(
        self,
        client_id: str,
        port: int,
        certs=None,
        as_client=None,
        clean_session=True,
        websocket=False,
        origin=None,
        **login,
    ):
        self.messages: queue.Queue = queue.Queue()
        self.acked = threading.Event()
        c = self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv311,
            clean_session=clean_session,
            reconnect_on_failure=False,
            transport="websockets" if websocket else "tcp",
        )
        if websocket:  # (paho says its Origin is the broker's own address, unless told)
            c.ws_set_options(path="/mqtt", headers={"Origin": origin} if origin else None)
        if certs is not None:
            mine = {}
            if as_client is not None:  # a client certificate of the network proves who
                cert_dir = CertDir(certs)
                mine = {
                    "certfile": str(cert_dir.cert("client", as_client)),
                    "keyfile": str(cert_dir.key("client", as_client)),
                }
            c.tls_set(ca_certs=str(certs / "ca.crt"), **mine)
        if login:
            c.username_pw_set(login["username"], login.get("password"))
        connected: queue.Queue = queue.Queue()
        c.on_connect = lambda cl, ud, flags, rc, props: connected.put((rc, flags))
        c.on_message = lambda cl, ud, msg: self.messages.put(msg)
        c.on_subscribe = lambda cl, ud, mid, codes, props: self.acked.set()
        c.connect("127.0.0.1", port, keepalive=30)
        c.loop_start()
        self.rc, flags = connected.get(timeout=30)
        self.session_present = flags.session_present

    def subscribe(self, *filters: tuple[str, int]) -> None:
        self.acked.clear()
        self.client.subscribe(list(filters))
        assert self.acked.wait(30), "no SUBACK"

    def publish(self, topic: str, payload: bytes, qos: int) -> None:
        self.client.publish(topic, payload, qos).wait_for_publish(30)

    def received(self, n: int, within: float = 30) -> list:
        out = []
        deadline = time.monotonic() + within
        while len(out) < n:
            out.append(self.messages.get(timeout=max(0.1, deadline - time.monotonic())))
        return out

    def nothing_more(self, wait: float = 1.0) -> bool:
        try:
            extra = self.messages.get(timeout=wait)
        except queue.Empty:
            return True
        raise AssertionError(f"unexpected {extra.topic}: {extra.payload!r}")

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_mqtt_clients_across_super_super_clusters_with_ges_clients_beside(
    tmp_path, mosquitto_clients
):
    topology, ports = demo_with_mqtt(tmp_path)
    up = Up(topology, tmp_path / "run")  # secure by default: TLS on the MQTT ports too
    certs = up.certs
    clients = []
    children: list[subprocess.Popen] = []
    try:
        # mosquitto_sub at b20 (SSC-B), filters with both wildcards (its lines unbuffered)
        sub = subprocess.Popen(
            ["stdbuf", "-oL", mosquitto_clients, "-h", "127.0.0.1", "-p", str(ports["b20"]), "--cafile",
             str(certs / "ca.crt"), "--cert", str(CertDir(certs).cert("client", "admin")),
             "--key", str(CertDir(certs).key("client", "admin")), "-i", "dash", "-q", "1", "-v", "-d",
             "-t", "sensors/+/temp", "-t", "alerts/#"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        children.append(sub)
        lines: queue.Queue = queue.Queue()
        threading.Thread(target=lambda: [lines.put(ln) for ln in sub.stdout], daemon=True).start()
        while "SUBACK" not in lines.get(timeout=30):
            pass
        # paho at b11 (SSC-B too, another super-cluster) with '#': everything but $-topics
        every = Paho("every", ports["b11"], certs, "admin")
        clients.append(every)
        assert every.rc == 0
        every.subscribe(("#", 2))
        # a GES client at b16 with an XML profile's equivalent, --where
        ges_sub = subprocess.Popen(
            [*GES, "subscribe", str(topology), "-b", "b16", "--where", "@topic topic sensors/#",
             "--count", "4", "--timeout", "60", "--format", "jsonl", *up.auth],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        children.append(ges_sub)
        assert ges_sub.stderr.readline().startswith("subscribed at")
        # paho publishes at b1 (SSC-A) at every QoS
        pub = Paho("pub", ports["b1"], certs, "admin")
        clients.append(pub)
        sent = [
            ("sensors/k1/temp", b"t1", 0),
            ("sensors/k2/temp", b"t2", 1),
            ("sensors/k3/humidity", b"h3", 1),
            ("alerts", b"a0", 2),
            ("alerts/fire/hall", b"a1", 2),
            ("$SYS/load", b"s", 1),
            ("sensors/k4/temp", b"t4", 2),
        ]
        for topic, payload, qos in sent:
            pub.publish(topic, payload, qos)
        # GES's own publisher, with a topic, reaches MQTT subscribers
        done = ges("publish", topology, "-b", "b5", "--topic", "alerts/ges", "--payload", "g",
                   *up.auth)  # fmt: skip
        assert done.returncode == 0, done.stderr

        want = ["sensors/k1/temp t1", "sensors/k2/temp t2", "alerts a0", "alerts/fire/hall a1",
                "sensors/k4/temp t4", "alerts/ges g"]  # fmt: skip
        got = []
        while len(got) < len(want):
            line = lines.get(timeout=30).rstrip("\n")
            if not line.startswith(("Client ", "Subscribed ")):  # -d lines
                got.append(line)
        assert sorted(got) == sorted(want)
        assert got[:5] == want[:5]  # one publisher's messages in its order
        # '#' matched all but the $-topic, each once, at the lower of the two QoS
        everything = every.received(7)
        assert [(x.topic, x.payload, x.qos) for x in everything[:6]] == [
            (t, pl, q) for t, pl, q in sent if not t.startswith("$")
        ]
        assert (everything[6].topic, everything[6].payload) == ("alerts/ges", b"g")
        assert every.nothing_more()
        stdout, stderr = ges_sub.communicate(timeout=60)
        assert ges_sub.returncode == 0, stderr
        records = [json.loads(line) for line in stdout.splitlines()]
        assert [r["attributes"]["@topic"] for r in records] == [
            "sensors/k1/temp",
            "sensors/k2/temp",
            "sensors/k3/humidity",
            "sensors/k4/temp",
        ]
        assert [r["attributes"]["@qos"] for r in records] == [0, 1, 1, 2]

        # retained messages: published at b1 (mosquitto_pub) and b20 (paho), a subscriber
        # that comes later at b11 gets the last of each topic with RETAIN set; an empty one
        # clears its topic
        tls = ["--cafile", str(certs / "ca.crt"),
               "--cert", str(CertDir(certs).cert("client", "admin")),
               "--key", str(CertDir(certs).key("client", "admin"))]  # fmt: skip
        pub_tool = mosquitto_clients.replace("mosquitto_sub", "mosquitto_pub")

        def mosquitto_pub(port: int, topic: str, *message: str) -> None:
            done = subprocess.run(
                [pub_tool, "-h", "127.0.0.1", "-p", str(port), *tls, "-q", "1", "-r",
                 "-t", topic, *message],
                capture_output=True, text=True, timeout=30,
            )  # fmt: skip
            assert done.returncode == 0, done.stderr

        def retained_at(port: int, want: list[str]) -> list[str]:
            """What a new subscriber to config/# gets retained, asked until it is ``want``
            (retained messages reach the replicators as fast as routing takes them)."""
            deadline = time.monotonic() + 30
            while True:
                done = subprocess.run(
                    [mosquitto_clients, "-h", "127.0.0.1", "-p", str(port), *tls, "-q", "1",
                     "-t", "config/#", "-F", "%r %t %p", "-W", "2", "-C", str(len(want) + 1)],
                    capture_output=True, text=True, timeout=30,
                )  # fmt: skip
                got = sorted(done.stdout.splitlines())
                if got == want or time.monotonic() > deadline:
                    return got

        mosquitto_pub(ports["b1"], "config/b1", "-m", "first")
        mosquitto_pub(ports["b1"], "config/b1", "-m", "on")
        pub20 = Paho("pub20", ports["b20"], certs, "admin")
        clients.append(pub20)
        pub20.client.publish("config/b20/mode", b"eco", 1, retain=True).wait_for_publish(30)
        want = ["1 config/b1 on", "1 config/b20/mode eco"]
        assert retained_at(ports["b11"], want) == want
        assert retained_at(ports["b1"], want) == want  # another super-super-cluster's replicator
        mosquitto_pub(ports["b1"], "config/b1", "-n")  # cleared
        assert retained_at(ports["b11"], want[1:]) == want[1:]
        # live subscribers got them as they were published, RETAIN 0
        live = every.received(4)
        assert [(x.topic, x.payload, x.retain) for x in live] == [
            ("config/b1", b"first", 0), ("config/b1", b"on", 0), ("config/b20/mode", b"eco", 0),
            ("config/b1", b"", 0)
        ]  # fmt: skip
    finally:
        for child in children:  # nothing outlives the test, passed or failed
            child.kill()
            child.wait()
        for c in clients:
            c.stop()
        code = up.stop()
    assert code == 0


ACCESS = """\
roles:
  sensor: {publish: ["@topic topic sensors/#"], subscribe: none}
  viewer: {subscribe: ["@topic topic sensors/#"]}
"""


def connect_packet(client_id: str, will: tuple[str, bytes] | None = None) -> bytes:
    def s(b: bytes) -> bytes:
        return struct.pack("!H", len(b)) + b

    flags = 0x02 | (0x04 if will else 0)
    body = s(b"MQTT") + bytes([4, flags]) + struct.pack("!H", 30) + s(client_id.encode())
    if will:
        body += s(will[0].encode()) + s(will[1])
    return bytes([0x10, len(body)]) + body


def test_logins_permissions_takeover_wills_and_malformed_packets(tmp_path):
    topology, ports = demo_with_mqtt(tmp_path)
    up = Up(topology, tmp_path / "run", "--insecure")
    clients = []
    try:
        (tmp_path / "run").mkdir(exist_ok=True)
        watcher = Paho("watcher", ports["b3"])
        clients.append(watcher)
        watcher.subscribe(("status/#", 1), ("sensors/#", 1))

        # a will: a raw client connects with one and goes without DISCONNECT
        raw = socket.create_connection(("127.0.0.1", ports["b2"]))
        raw.sendall(connect_packet("gone", ("status/gone", b"offline")))
        assert raw.recv(4) == b"\x20\x02\x00\x00"  # CONNACK, accepted
        raw.close()
        (will,) = watcher.received(1)
        assert (will.topic, will.payload) == ("status/gone", b"offline")

        # a malformed packet closes that connection (and publishes its will), nothing else
        bad = socket.create_connection(("127.0.0.1", ports["b2"]))
        bad.sendall(connect_packet("bad", ("status/bad", b"malformed")))
        assert bad.recv(4) == b"\x20\x02\x00\x00"
        bad.sendall(b"\x30\x05\x00\x03a/+x")  # a PUBLISH to a topic with a wildcard
        bad.settimeout(10)
        assert bad.recv(10) == b""  # closed
        (will,) = watcher.received(1)
        assert will.payload == b"malformed"

        # a second connection with a client id takes over: the first is closed, by the
        # broker, so its will is published (§3.1.2.5)
        first = socket.create_connection(("127.0.0.1", ports["b4"]))
        first.sendall(connect_packet("same", ("status/same", b"taken over")))
        assert first.recv(4) == b"\x20\x02\x00\x00"
        second = socket.create_connection(("127.0.0.1", ports["b4"]))
        second.sendall(connect_packet("same"))
        assert second.recv(4) == b"\x20\x02\x00\x00"
        first.settimeout(10)
        assert first.recv(10) == b""
        (will,) = watcher.received(1)
        assert (will.topic, will.payload) == ("status/same", b"taken over")
        second.close()

        # QoS 2 exactly once across brokers: a persistent publisher's PUBLISH is kept by its
        # session before PUBREC; sent again at another broker (as if PUBREC was lost with the
        # connection) it is acknowledged and not published twice (§4.3.3, §4.4)
        def exchange(sock, *packets, until=None) -> list:
            sock.sendall(b"".join(p.encode(x) for x in packets))
            reader, got = PacketReader(), []
            sock.settimeout(30)
            while until is not None and not any(type(x) is until for x in got):
                data = sock.recv(65536)
                assert data, f"closed before a {until.__name__}, after {got}"
                reader.feed(data)
                got += [p.decode(x) for x in reader.packets()]
            return got

        q2 = socket.create_connection(("127.0.0.1", ports["b2"]))
        exchange(q2, p.Connect("q2", clean_session=False), until=p.ConnAck)
        exchange(q2, p.Subscribe(1, (("q2/#", 1),)), until=p.SubAck)  # the session exists
        got = exchange(q2, p.Publish("status/q2", b"once", 2, packet_id=7), until=p.PubRec)
        assert p.PubRec(7) in got
        q2.close()  # without PUBREL: it is owed
        (first,) = watcher.received(1)
        q2 = socket.create_connection(("127.0.0.1", ports["b17"]))  # SSC-B
        (ack,) = exchange(q2, p.Connect("q2", clean_session=False), until=p.ConnAck)
        assert ack.session_present
        got = exchange(q2, p.Publish("status/q2", b"once", 2, dup=True, packet_id=7),
                       until=p.PubRec)  # fmt: skip
        assert p.PubRec(7) in got
        assert p.PubComp(7) in exchange(q2, p.PubRel(7), until=p.PubComp)
        got = exchange(q2, p.Publish("status/q2", b"next", 2, packet_id=7), until=p.PubRec)
        exchange(q2, p.PubRel(7), until=p.PubComp)
        exchange(q2, p.Disconnect())
        q2.close()
        (second,) = watcher.received(1)
        assert (first.payload, second.payload) == (b"once", b"next")  # not b"once" twice
        # and the other way: a persistent QoS 2 subscriber that PUBREC'd a message and lost its
        # connection before PUBCOMP is sent PUBREL again at another broker, not the message
        q2s = socket.create_connection(("127.0.0.1", ports["b7"]))
        exchange(q2s, p.Connect("q2s", clean_session=False), until=p.ConnAck)
        exchange(q2s, p.Subscribe(1, (("q2s/#", 2),)), until=p.SubAck)
        pub = Paho("p2", ports["b9"])
        clients.append(pub)
        pub.publish("q2s/a", b"m", 2)
        got = exchange(q2s, until=p.Publish)
        (msg,) = [x for x in got if type(x) is p.Publish]
        assert (msg.payload, msg.qos) == (b"m", 2)
        assert p.PubRel(msg.packet_id) in exchange(q2s, p.PubRec(msg.packet_id), until=p.PubRel)
        q2s.close()  # without PUBCOMP
        q2s = socket.create_connection(("127.0.0.1", ports["b19"]))  # SSC-B
        got = exchange(q2s, p.Connect("q2s", clean_session=False), until=p.PubRel)
        assert got == [p.ConnAck(p.ACCEPTED, True), p.PubRel(msg.packet_id)]
        exchange(q2s, p.PubComp(msg.packet_id))
        q2s.settimeout(1.0)
        with pytest.raises(TimeoutError):
            q2s.recv(100)  # and not the message again
        q2s.close()

        # not MQTT at all: closed, and the broker goes on serving
        junk = socket.create_connection(("127.0.0.1", ports["b4"]))
        junk.sendall(b"GET / HTTP/1.1\r\n\r\n")
        junk.settimeout(10)
        assert junk.recv(10) == b""
        pub = Paho("p", ports["b4"])
        clients.append(pub)
        pub.publish("sensors/x", b"still", 1)
        (msg,) = watcher.received(1)
        assert msg.payload == b"still"
    finally:
        for c in clients:
            c.stop()
        code = up.stop()
    assert code == 0


def login(clients: list, client_id: str, port: int, certs, user: str, token: str) -> Paho:
    """A client logged in as ``user``: brokers read a changed access file within a second
    (ges.runtime.access), so a login just after ``ges users add`` may be tried again."""
    deadline = time.monotonic() + 15
    while True:
        client = Paho(client_id, port, certs, username=user, password=token)
        clients.append(client)
        if client.rc == 0 or time.monotonic() > deadline:
            assert client.rc == 0, client.rc
            return client
        time.sleep(0.5)


def test_mqtt_users_and_their_permissions(tmp_path):
    topology, ports = demo_with_mqtt(tmp_path)
    up = Up(topology, tmp_path / "run")
    clients = []
    try:
        certs = up.certs
        (certs / "access.yaml").write_text(ACCESS)
        tokens = {}
        for user, role in (("sensor1", "sensor"), ("viewer1", "viewer")):
            added = ges("users", "add", topology, user, "--role", role, *up.auth)
            assert added.returncode == 0, added.stderr
            tokens[user] = added.stdout.splitlines()[-1].removeprefix("GES_TOKEN=")
        wrong = Paho("w", ports["b1"], certs, username="sensor1", password="not-it")
        clients.append(wrong)
        assert wrong.rc == 4 or str(wrong.rc) == "Bad user name or password"
        viewer = login(clients, "v", ports["b20"], certs, "viewer1", tokens["viewer1"])
        viewer.subscribe(("sensors/#", 1))
        codes: queue.Queue = queue.Queue()
        viewer.client.on_subscribe = lambda cl, ud, mid, rcs, props: codes.put(rcs)
        viewer.client.subscribe("admin/#", 1)  # not its to read: 0x80
        assert [rc.value for rc in codes.get(timeout=30)] == [0x80]
        sensor = login(clients, "s", ports["b1"], certs, "sensor1", tokens["sensor1"])
        sensor.publish("admin/secret", b"no", 1)  # acknowledged, dropped (MQTT 3.1.1)
        sensor.publish("sensors/a", b"yes", 1)
        (msg,) = viewer.received(1)
        assert (msg.topic, msg.payload) == ("sensors/a", b"yes")
        assert viewer.nothing_more()
    finally:
        for c in clients:
            c.stop()
        code = up.stop()
    assert code == 0


def test_a_persistent_qos1_subscriber_moved_between_brokers_under_load_gets_everything(
    tmp_path,
):
    """The must-show of issue 23: 10,000 QoS 1 messages published at b1 while a persistent
    subscriber is taken over at another broker every two or three seconds, across
    super-clusters and super-super-clusters; every message arrives, and each that arrives
    again is marked DUP. Where it stays three seconds its session is handed over to the
    replicator of its unit (``handover_after`` 1s) under load: the client stays connected."""
    topology, ports = demo_with_mqtt(tmp_path, handover_after="1s")
    up = Up(topology, tmp_path / "run", "--insecure", "--log-level", "info")
    received: list[tuple[int, bool]] = []
    lock = threading.Lock()
    subs: list[mqtt.Client] = []

    def subscriber(broker: str) -> mqtt.Client:
        c = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2,
            client_id="roamer",
            clean_session=False,
            protocol=mqtt.MQTTv311,
            reconnect_on_failure=False,  # taken over: it must not take the session back
        )
        connected: queue.Queue = queue.Queue()
        c.on_connect = lambda cl, ud, flags, rc, props: connected.put((rc, flags))

        def on_message(cl, ud, msg):
            with lock:
                received.append((int(msg.payload), bool(msg.dup)))
                per_broker[broker] = per_broker.get(broker, 0) + 1

        c.on_message = on_message
        c.connect("127.0.0.1", ports[broker], keepalive=30)
        c.loop_start()
        rc, flags = connected.get(timeout=30)
        assert rc == 0, rc
        return c, flags.session_present

    N = 10_000
    per_broker: dict[str, int] = {}  # what each connection received, in the order of the moves
    try:
        first, present = subscriber("b20")
        subs.append(first)
        assert not present
        done = threading.Event()
        first.on_subscribe = lambda *a: done.set()
        first.subscribe("load/#", 1)
        assert done.wait(30)
        pub = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id="loader", protocol=mqtt.MQTTv311
        )
        pub.max_inflight_messages_set(500)
        pub.max_queued_messages_set(0)
        pub.connect("127.0.0.1", ports["b1"])
        pub.loop_start()

        def publish_all():  # about 500 a second: the moves happen under load
            for i in range(N):
                pub.publish(f"load/{i % 10}", str(i).encode(), 1)
                if i % 50 == 49:
                    time.sleep(0.1)

        publisher = threading.Thread(target=publish_all)
        publisher.start()
        moves = ["b12", "b3", "b17", "b9", "b20", "b6", "b14", "b1"]
        taken = []
        for n, broker in enumerate(moves):
            time.sleep(1.5 if n % 2 else 3)  # time for a hand-over every other stay
            with lock:
                if len({n for n, _ in received}) >= N:
                    break
            new, present = subscriber(broker)  # takes the session over from the last one
            assert present  # the session was found at whichever broker holds it
            old = subs[-1]
            subs.append(new)
            old.loop_stop()
            taken.append(broker)
        publisher.join(timeout=120)
        assert not publisher.is_alive(), "the publisher is stuck (its broker stopped reading it)"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            with lock:
                if len({n for n, _ in received}) >= N:
                    break
            time.sleep(0.2)
        with lock:
            got = list(received)
            have = len({n for n, _ in got})
        # a stall says where the session stopped (paho's loop_stop may hang on it: not called)
        assert have >= N, (
            f"stalled: {have} of {N} received; per connection {per_broker}; missing "
            f"{sorted(set(range(N)) - {n for n, _ in got})[:20]}; log {up.log_tail()}"
        )
        pub.loop_stop()
        # each message goes once without DUP at most: a repeat is marked (the old and the new
        # connection's threads may put theirs in the list in either order)
        seen: set[int] = set()
        first_tries: set[int] = set()
        repeated_without_dup = []
        for n, dup in got:
            if not dup:
                if n in first_tries:
                    repeated_without_dup.append(n)
                first_tries.add(n)
            seen.add(n)
        assert len(taken) >= 6, taken
        handed = up.log_path.read_text().count("handed over to replicator")
        print(f"moves {taken}, {handed} hand-overs, {len(got)} received, {len(got) - N} again")
        assert handed >= 1  # (ges.core.handover logs each at info)
        assert seen == set(range(N)), f"missing {sorted(set(range(N)) - seen)[:20]}"
        assert not repeated_without_dup, repeated_without_dup[:20]
    finally:
        for c in subs:
            c.loop_stop()
        code = up.stop()
    assert code == 0


def test_mqtt_over_websocket_roams_between_brokers_and_refuses_what_is_no_upgrade(tmp_path):
    """A browser's MQTT: paho over wss:// (the network's TLS, a client certificate), a
    persistent QoS 1 subscriber that leaves and comes back over WebSocket at a broker of
    another super-cluster and gets what it missed, beside MQTT over TCP; an opening that is no
    WebSocket upgrade for MQTT gets an HTTP error."""
    topology, ports = demo_with_mqtt(tmp_path, websocket=("b1", "b11", "b20"))
    up = Up(topology, tmp_path / "run")  # TLS: wss://
    certs = up.certs
    clients = []
    try:
        sub = Paho("tab", ports["b11", "ws"], certs, "admin", clean_session=False, websocket=True)
        clients.append(sub)
        assert sub.rc == 0 and not sub.session_present
        sub.subscribe(("ws/#", 1))
        pub = Paho("pub", ports["b1"], certs, "admin")  # MQTT over TCP, SSC-A
        clients.append(pub)
        for i in range(20):
            pub.publish(f"ws/{i % 3}", b"x" * 3000 + str(i).encode(), 1)
        got = sub.received(20)
        assert sorted(int(m.payload[3000:]) for m in got) == list(range(20))
        sub.stop()  # DISCONNECT: the session keeps what comes
        for i in range(20, 60):
            pub.publish("ws/later", str(i).encode(), 1)
        back = Paho("tab", ports["b20", "ws"], certs, "admin", clean_session=False, websocket=True)
        clients.append(back)
        assert back.session_present
        assert sorted(int(m.payload) for m in back.received(40)) == list(range(20, 60))
        back.publish("ws/back", b"from a browser", 1)  # and it publishes over WebSocket
        (echo,) = back.received(1)
        assert (echo.topic, echo.payload) == ("ws/back", b"from a browser")
        # a page of another site, in a browser that holds admin's certificate: the
        # certificate proves nothing of that page (it must log in: not authorized)
        evil = Paho("evil", ports["b1", "ws"], certs, "admin", websocket=True,
                    origin="https://evil.example")  # fmt: skip
        clients.append(evil)
        assert str(evil.rc) == "Not authorized"
        # an opening that is no upgrade for MQTT: an HTTP error, then the end
        context = ssl.create_default_context(cafile=str(certs / "ca.crt"))
        with (
            socket.create_connection(("127.0.0.1", ports["b1", "ws"]), timeout=10) as raw,
            context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            tls.sendall(b"GET /mqtt HTTP/1.1\r\nHost: b1\r\n\r\n")
            answer = b""
            while chunk := tls.recv(4096):
                answer += chunk
        assert answer.startswith(b"HTTP/1.1 400 Bad Request")
    finally:
        for c in clients:
            c.stop()
        code = up.stop()
    assert code == 0, up.log_tail()
    assert "refused an MQTT connection from 127.0.0.1:" in up.log_tail(200_000)
    assert ": not a WebSocket upgrade request: " in up.log_tail(200_000)


def test_a_persistent_subscriber_gets_what_it_missed_at_another_broker_even_with_its_own_killed(
    tmp_path,
):
    """Disconnect, miss messages, come back elsewhere: all of them; then the same after a
    kill -9 of the broker it was connected to (ges up --processes restarts it)."""
    topology, ports = demo_with_mqtt(tmp_path)
    up = Up(topology, tmp_path / "run", "--insecure", "--processes")
    clients = []
    try:
        sub = Paho("away", ports["b16"], clean_session=False)
        clients.append(sub)
        sub.subscribe(("news/#", 1))
        sub.stop()  # DISCONNECT: the session stays and stores
        pub = Paho("pub", ports["b1"])
        clients.append(pub)
        for i in range(100):
            pub.publish("news/a", str(i).encode(), 1)
        back = Paho("away", ports["b14"], clean_session=False)  # another cluster
        clients.append(back)
        assert back.session_present
        assert sorted(int(x.payload) for x in back.received(100)) == list(range(100))
        back.subscribe(("extra/#", 1))  # a SUBSCRIBE on the open session keeps it open
        pub.publish("extra/x", b"-1", 1)
        (extra,) = back.received(1)
        assert extra.topic == "extra/x" and back.client.is_connected()
        # now its broker dies under it
        # (b14 is not a replicator: the session's, SC-3's, is on b12)
        pid = next(b["pid"] for b in up.run_json()["brokers"] if b["id"] == "b14")
        os.kill(pid, signal.SIGKILL)
        for i in range(100, 200):
            pub.publish("news/a", str(i).encode(), 1)
        again = Paho("away", ports["b19"], clean_session=False)  # SC-4
        clients.append(again)
        assert again.session_present
        got = again.received(100)
        before = {*range(100), -1}  # what it had: any of it again comes with DUP
        fresh = sorted({int(x.payload) for x in got} - before)
        while len(fresh) < 100:
            got += again.received(1)
            fresh = sorted({int(x.payload) for x in got} - before)
        assert fresh == list(range(100, 200))
        assert all(x.dup for x in got if int(x.payload) in before)
        # a replicator that hangs (stopped, not dead: no reset) holds a clean session's
        # CONNACK up no more than DISCARD_WAIT, whatever the client id had there
        stopped = next(b["pid"] for b in up.run_json()["brokers"] if b["id"] == "b12")
        os.kill(stopped, signal.SIGSTOP)
        try:
            started = time.monotonic()
            passer = Paho("passer-by", ports["b20"])
            clients.append(passer)
            assert passer.rc == 0 and time.monotonic() - started < DISCARD_WAIT + 2
        finally:
            os.kill(stopped, signal.SIGCONT)
        # and its replicator (SC-3's, b12) dies: an open that cannot reach it is CONNACK 3,
        # at once, and the client tries again until the restarted replicator has it
        again.stop()
        for i in range(200, 250):
            pub.publish("news/a", str(i).encode(), 1)
        pub.client.publish("cfg/x", b"old", 1, retain=True).wait_for_publish(30)
        time.sleep(1.0)  # every replicator has it
        pid = next(b["pid"] for b in up.run_json()["brokers"] if b["id"] == "b12")
        os.kill(pid, signal.SIGKILL)
        # retained while the replicator is down: it catches up once restarted
        pub.client.publish("cfg/x", b"new", 1, retain=True).wait_for_publish(30)
        codes = []
        deadline = time.monotonic() + 60
        while True:
            last = Paho("away", ports["b20"], clean_session=False)
            clients.append(last)
            codes.append(str(last.rc))
            if last.rc == 0 or time.monotonic() > deadline:
                break
            assert str(last.rc) == "Server unavailable", codes
            time.sleep(1)
        assert last.rc == 0 and last.session_present, codes
        got = last.received(50)
        while {int(x.payload) for x in got} < set(range(200, 250)):
            got += last.received(1)
        assert all(x.dup for x in got if int(x.payload) < 200)
        # a subscriber homed at the restarted replicator gets what was retained meanwhile
        # (asked again until its read-back of the logs is done; without it: "old" for good)
        near = Paho("near", ports["b13"])
        clients.append(near)
        deadline = time.monotonic() + 30
        while True:
            near.subscribe(("cfg/x", 1))
            (kept,) = near.received(1)
            if kept.payload == b"new" or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert kept.retain and kept.payload == b"new"
        # a clean session with its client id discards it (§3.1.2.4), at another broker: the
        # connection that had it is closed, and a persistent one after starts afresh
        last.client.on_disconnect = lambda *a: last.messages.put("closed")
        clean = Paho("away", ports["b5"])
        clients.append(clean)
        assert clean.rc == 0 and not clean.session_present
        while last.messages.get(timeout=30) != "closed":
            pass
        fresh = Paho("away", ports["b16"], clean_session=False)
        clients.append(fresh)
        assert fresh.rc == 0 and not fresh.session_present
        pub.publish("news/a", b"-2", 1)
        assert fresh.nothing_more(1.0)  # no filters of the old session
    finally:
        for c in clients:
            c.stop()
        code = up.stop()
    assert code == 0


class Paho5:
    """A paho-mqtt client speaking MQTT 5.0 on its own thread."""

    def __init__(
        self, client_id: str, port: int, *, expiry: int = 0, clean_start: bool = True, will=None
    ):
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        self.messages: queue.Queue = queue.Queue()
        self.events: queue.Queue = queue.Queue()
        c = self.client = mqtt.Client(
            mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )  # fmt: skip
        c.on_connect = lambda cl, ud, flags, rc, props: self.events.put(
            ("connack", flags, rc, props)
        )
        c.on_disconnect = lambda cl, ud, flags, rc, props: self.events.put(
            ("disconnect", rc, props)
        )
        c.on_subscribe = lambda cl, ud, mid, codes, props: self.events.put(("suback", codes))
        c.on_message = lambda cl, ud, msg: self.messages.put(msg)
        if will is not None:
            c.will_set(*will)
        props = Properties(PacketTypes.CONNECT)
        if expiry:
            props.SessionExpiryInterval = expiry
        c.connect("127.0.0.1", port, keepalive=30, clean_start=clean_start, properties=props)
        c.loop_start()
        kind, flags, self.rc, self.props = self.events.get(timeout=30)
        self.session_present = flags.session_present

    def subscribe(self, topic: str, ident: int = 0, **options) -> list:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties
        from paho.mqtt.subscribeoptions import SubscribeOptions

        props = None
        if ident:
            props = Properties(PacketTypes.SUBSCRIBE)
            props.SubscriptionIdentifier = ident
        self.client.subscribe(topic, options=SubscribeOptions(**options), properties=props)
        kind, codes = self.events.get(timeout=30)
        assert kind == "suback"
        return codes

    def publish(
        self, topic: str, payload: bytes, qos: int, expiry: int = 0, alias: int = 0, **user
    ) -> None:
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.properties import Properties

        props = Properties(PacketTypes.PUBLISH)
        if expiry:
            props.MessageExpiryInterval = expiry
        if alias:
            props.TopicAlias = alias
        if user:
            props.UserProperty = list(user.items())
        self.client.publish(topic, payload, qos, properties=props).wait_for_publish(30)

    def stop(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def test_mqtt5_clients_properties_options_sessions_and_reasons(tmp_path):
    """paho-mqtt speaking MQTT 5.0 across super-super-clusters: user properties as attributes
    (a 3.1.1 client and a GES client beside it), No Local, subscription identifiers, a
    persistent session by its Session Expiry Interval resumed at another broker, a takeover
    said with its reason."""
    topology, ports = demo_with_mqtt(tmp_path)
    up = Up(topology, tmp_path / "run", "--insecure")
    clients: list = []
    try:
        a = Paho5("five-a", ports["b2"])
        clients.append(a)
        assert a.rc == 0 and str(a.rc) == "Success"
        assert a.props.SharedSubscriptionAvailable == 0
        b = Paho5("five-b", ports["b17"])
        clients.append(b)
        old = Paho("three", ports["b11"])
        clients.append(old)
        old.subscribe(("m/#", 1))
        assert [str(c) for c in b.subscribe("m/#", qos=1, ident=3)] == ["Granted QoS 1"]
        assert [str(c) for c in a.subscribe("m/#", qos=1, noLocal=True)] == ["Granted QoS 1"]
        ges_sub = subprocess.Popen(
            [*GES, "subscribe", str(topology), "-b", "b16", "--where", "site = north",
             "--count", "1", "--timeout", "60", "--format", "jsonl", "--insecure"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        clients.append(ges_sub)
        assert ges_sub.stderr.readline().startswith("subscribed at")
        a.publish("m/1", b"hello", 1, site="north", unit="7")
        got = b.messages.get(timeout=30)
        assert (got.topic, got.payload) == ("m/1", b"hello")
        assert sorted(got.properties.UserProperty) == [("site", "north"), ("unit", "7")]
        assert got.properties.SubscriptionIdentifier == [3]  # its filter's (§3.3.4)
        (three,) = old.received(1)  # a 3.1.1 subscriber gets the message, without them
        assert three.payload == b"hello"
        stdout, _ = ges_sub.communicate(timeout=60)
        assert json.loads(stdout)["attributes"]["unit"] == "7"  # a GES client: attributes
        b.publish("m/2", b"from b", 1)
        assert a.messages.get(timeout=30).payload == b"from b"
        with pytest.raises(queue.Empty):
            a.messages.get(timeout=1)  # No Local: not its own m/1
        # a DISCONNECT with a reason other than 0 publishes the will (§3.14.4)
        from paho.mqtt.packettypes import PacketTypes
        from paho.mqtt.reasoncodes import ReasonCode

        w = Paho5("five-w", ports["b5"], will=("m/will", b"gone", 1))
        w.client.disconnect(reasoncode=ReasonCode(PacketTypes.DISCONNECT, identifier=0x04))
        w.client.loop_stop()
        assert b.messages.get(timeout=30).payload == b"from b"  # its own: no No Local
        assert b.messages.get(timeout=30).payload == b"gone"
        # topic aliases: the name once with its alias, then the alias alone
        assert a.props.TopicAliasMaximum == 64
        a.publish("m/aliased", b"named", 1, alias=3)
        a.publish("", b"by alias", 1, alias=3)
        got = [b.messages.get(timeout=30) for _ in range(2)]
        assert [(x.topic, x.payload) for x in got] == [
            ("m/aliased", b"named"),
            ("m/aliased", b"by alias"),
        ]

        # a persistent session by its Session Expiry Interval: away, then back elsewhere
        s = Paho5("five-s", ports["b4"], expiry=3600)
        clients.append(s)
        s.subscribe("news/#", qos=1, ident=7)
        s.subscribe("mine/#", qos=1, noLocal=True)
        s.stop()
        for i in range(5):
            a.publish("news/x", str(i).encode(), 1)
        # and two with a Message Expiry Interval: one is over before it comes back
        a.publish("news/short", b"stale", 1, expiry=1)
        a.publish("news/long", b"fresh", 1, expiry=3600)
        time.sleep(2.5)
        back = Paho5("five-s", ports["b19"], expiry=3600, clean_start=False)
        clients.append(back)
        assert back.session_present
        got = [back.messages.get(timeout=30) for _ in range(6)]
        assert [m.payload for m in got] == [str(i).encode() for i in range(5)] + [b"fresh"]
        assert 3590 <= got[5].properties.MessageExpiryInterval <= 3598  # what is left of it
        assert not hasattr(got[0].properties, "MessageExpiryInterval")
        # the session keeps its filters' subscription identifiers wherever it resumes
        assert {tuple(m.properties.SubscriptionIdentifier) for m in got} == {(7,)}
        # No Local is the session's: resumed at another broker, its own still do not come
        back.publish("mine/1", b"own", 1)
        a.publish("mine/2", b"other", 1)
        assert back.messages.get(timeout=30).payload == b"other"
        with pytest.raises(queue.Empty):
            back.messages.get(timeout=1)
        # taken over at the same broker: the old connection is told why (0x8E)
        again = Paho5("five-s", ports["b19"], expiry=3600, clean_start=False)
        clients.append(again)
        kind, rc, props = back.events.get(timeout=30)
        assert kind == "disconnect" and rc.value == 0x8E, (kind, rc)
        # paho's reconnect by default (no Clean Start, no interval), at a broker of another
        # super-super-cluster: the session resumes, and ends as that connection closes
        again.stop()
        a.publish("news/y", b"missed", 1)
        once = Paho5("five-s", ports["b11"], clean_start=False)
        assert once.session_present
        assert once.messages.get(timeout=30).payload == b"missed"
        once.stop()
        time.sleep(0.5)
        after = Paho5("five-s", ports["b11"], clean_start=False)
        clients.append(after)
        assert not after.session_present
        # a Session Expiry Interval of 2 s: kept when its client comes back at once, gone
        # once it has been away for longer (§3.1.2.11.2)
        e = Paho5("five-e", ports["b4"], expiry=2, clean_start=False)
        e.subscribe("news/#", qos=1)
        e.stop()
        e = Paho5("five-e", ports["b19"], expiry=2, clean_start=False)
        assert e.session_present
        e.stop()
        time.sleep(3.0)
        e = Paho5("five-e", ports["b19"], expiry=2, clean_start=False)
        clients.append(e)
        assert not e.session_present
    finally:
        for c in clients:
            if isinstance(c, subprocess.Popen):
                c.kill()
                c.wait()
            else:
                c.stop()
        code = up.stop()
    assert code == 0
