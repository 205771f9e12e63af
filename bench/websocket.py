"""MQTT over WebSocket against MQTT over TCP, measured in the same run: what the WebSocket
layer (ges.transport.websocket) costs a broker.

    python bench/websocket.py [--quick] [--json] [--settle S] [--latency-s S]

One ``ges broker --insecure --mqtt-port P --mqtt-ws-port W`` (own process), and — when the
Debian package ``mosquitto`` is installed and its build has WebSockets — mosquitto with the
same two listeners, as the baseline of what a WebSocket costs a C broker. For each broker and
transport, taking turns, three rounds (one with ``--quick``), a subscriber and a publisher
process of this script (blocking sockets, MQTT 3.1.1, QoS 0, topic ``b/t``, 100-byte payloads):

1. ``throughput``: the publisher writes N PUBLISHes back to back — over WebSocket each in a
   binary message of its own, as a browser's client sends them (masked with a zero key, so
   the client's cost is no more than over TCP) — and the subscriber counts them: messages/s
   from the first write to the last arrival, and the broker's CPU per message (``/proc``);
2. ``latency``: one PUBLISH a millisecond for a few seconds, each stamped with
   ``time.monotonic_ns()``: p50, p99 and the maximum of arrival minus stamp, one hop —
   :data:`SETTLE` seconds after the throughput run (``--settle``; 0 measures what the seconds
   right after a burst cost a client).

The table shows each figure per transport and the ratio WebSocket/TCP, per broker. Exit code 0
when every run delivered every message, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ges.mqtt import packets as p  # noqa: E402
from ges.mqtt.frames import PacketReader  # noqa: E402
from ges.runtime.ports import free_ports  # noqa: E402

GES = [sys.executable, "-m", "cli.main"]
SIZES = {
    "quick": {"rounds": 1, "messages": 100_000, "latency_s": 2.0},
    "full": {"rounds": 3, "messages": 300_000, "latency_s": 4.0},
}
#: Seconds between a throughput run and the latency run after it: in the seconds after a burst
#: of 300,000 messages GES stalled (a fresh broker's retained catch-up read the burst back
#: once, in 40 ms steps until a5708ed; its log's checkpoints and release held its commits back
#: up to 270 ms until 032cdbf: bench/README.md), and a p99 taken meanwhile measures that, not
#: the transport.
SETTLE = 8.0
TOPIC = "b/t"
PAYLOAD = 100
UPGRADE = (
    "GET /mqtt HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n"
    "Sec-WebSocket-Protocol: mqtt\r\n\r\n"
)


# -- the two transports, client side ----------------------------------------------------------


def ws_frame(data: bytes) -> bytes:
    """One binary message, masked with a zero key (its payload is as it is)."""
    n = len(data)
    if n < 126:
        head = bytes([0x82, 0x80 | n])
    elif n < 65536:
        head = bytes([0x82, 0x80 | 126]) + struct.pack("!H", n)
    else:
        head = bytes([0x82, 0x80 | 127]) + struct.pack("!Q", n)
    return head + b"\0\0\0\0" + data


class Link:
    """A client's connection, MQTT's bytes in and out, over TCP or a WebSocket."""

    def __init__(self, port: int, ws: bool):
        self.sock = socket.create_connection(("127.0.0.1", port))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.ws = ws
        self._raw = b""
        if ws:
            self.sock.sendall(UPGRADE.format(port=port).encode())
            while b"\r\n\r\n" not in self._raw:
                self._raw += self.sock.recv(65536)
            head, _, self._raw = self._raw.partition(b"\r\n\r\n")
            if not head.startswith(b"HTTP/1.1 101"):
                raise SystemExit(f"upgrade refused: {head[:80]!r}")

    def frame(self, data: bytes) -> bytes:
        """``data`` as it goes on the wire (over WebSocket: one message)."""
        return ws_frame(data) if self.ws else data

    def recv(self) -> bytes:
        """MQTT's bytes of the next read (over WebSocket: the payload of whole frames);
        EOFError once the broker closed."""
        more = self.sock.recv(1 << 20)
        if not more:
            raise EOFError
        data = self._raw + more
        if not self.ws:
            self._raw = b""
            return data
        out, i = [], 0
        while len(data) - i >= 2:
            n, at = data[i + 1] & 0x7F, i + 2
            if n == 126:
                if len(data) - at < 2:
                    break
                (n,), at = struct.unpack_from("!H", data, at), at + 2
            elif n == 127:
                if len(data) - at < 8:
                    break
                (n,), at = struct.unpack_from("!Q", data, at), at + 8
            if len(data) - at < n:
                break
            if data[i] & 0x0F == 0x2:  # binary (a server's frames are not masked)
                out.append(data[at : at + n])
            i = at + n
        self._raw = data[i:]
        return b"".join(out)


def session(port: int, ws: bool, client_id: str, subscribe: bool) -> tuple[Link, PacketReader]:
    link = Link(port, ws)
    hello = p.encode(p.Connect(client_id, keepalive=60))
    if subscribe:
        hello = link.frame(hello) + link.frame(p.encode(p.Subscribe(1, ((TOPIC, 0),))))
    else:
        hello = link.frame(hello)
    link.sock.sendall(hello)
    reader, want = PacketReader(), 2 if subscribe else 1
    got: list = []
    while len(got) < want:
        reader.feed(link.recv())
        got += reader.packets()
    return link, reader


# -- the two processes --------------------------------------------------------------------------


def sub_main(args) -> None:
    link, reader = session(args.port, args.ws, f"sub-{os.getpid()}", subscribe=True)
    link.sock.settimeout(30.0)  # (nothing for that long: what came is what it gets)
    print("ready", flush=True)
    count, first, last, delays = 0, None, None, []
    while count < args.expect:
        try:
            data = link.recv()
        except (EOFError, TimeoutError):
            break
        now = time.monotonic_ns()
        reader.feed(data)
        for pkt in reader.packets():
            if pkt.name != "PUBLISH":
                continue
            count += 1
            first = first or now
            last = now
            if args.latency:
                publish = p.decode(pkt)
                delays.append((now - int.from_bytes(publish.payload[:8], "big")) / 1000)
    print(json.dumps({"count": count, "first": first, "last": last, "delays": delays}), flush=True)


def pub_main(args) -> None:
    link, _ = session(args.port, args.ws, f"pub-{os.getpid()}", subscribe=False)
    print("ready", flush=True)
    sys.stdin.readline()  # go
    started = time.monotonic_ns()
    if args.rate:
        gap, due = 1e9 / args.rate, time.monotonic_ns()
        for _ in range(args.messages):
            while (now := time.monotonic_ns()) < due:
                time.sleep(max(0.0, (due - now) / 1e9 - 0.0002))
            payload = now.to_bytes(8, "big") + b"x" * (PAYLOAD - 8)
            link.sock.sendall(link.frame(p.encode(p.Publish(TOPIC, payload))))
            due += gap
    else:
        one = link.frame(p.encode(p.Publish(TOPIC, b"x" * PAYLOAD)))
        chunk = one * max(1, 65536 // len(one))
        per = len(chunk) // len(one)
        for _ in range(args.messages // per):
            link.sock.sendall(chunk)
        link.sock.sendall(one * (args.messages % per))
    print(json.dumps({"started": started}), flush=True)
    time.sleep(1.0)  # (what is in flight goes before the connection closes)


# -- the harness -----------------------------------------------------------------------------------


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def worker(role: str, port: int, ws: bool, **more) -> subprocess.Popen:
    cmd = [sys.executable, __file__, role, "--port", str(port)] + (["--ws"] if ws else [])
    for k, v in more.items():
        cmd += [f"--{k}", str(v)] if v is not True else [f"--{k}"]
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if line.strip() != "ready":
        raise SystemExit(f"{role} over {'WebSocket' if ws else 'TCP'}: {line!r}")
    return proc


def run(pid: int, port: int, ws: bool, messages: int, rate: int | None = None) -> dict:
    latency = rate is not None
    sub = worker("sub", port, ws, expect=messages, **({"latency": True} if latency else {}))
    pub = worker("pub", port, ws, messages=messages, **({"rate": rate} if rate else {}))
    before = cpu_seconds(pid)
    pub.stdin.write("go\n")
    pub.stdin.flush()
    try:
        got = json.loads(sub.stdout.readline() or "{}")
        sent = json.loads(pub.stdout.readline() or "{}")
    finally:
        for proc in (sub, pub):
            proc.kill()
            proc.wait()
    used = cpu_seconds(pid) - before
    count = got.get("count", 0)
    out = {"delivered": count, "lost": messages - count}
    if count:
        out["broker_cpu_us_per_message"] = round(1e6 * used / count, 2)
    if latency and got.get("delays"):
        delays = sorted(got["delays"])
        out["p50_us"] = round(delays[len(delays) // 2], 1)
        out["p99_us"] = round(delays[int(len(delays) * 0.99)], 1)
        out["max_us"] = round(delays[-1], 1)
    elif count and got.get("last") and sent.get("started"):
        out["messages_per_s"] = round(count / ((got["last"] - sent["started"]) / 1e9))
    return out


def start_ges(tmp: Path, port: int, ws_port: int) -> subprocess.Popen:
    (gport,) = free_ports(1)
    topology = {"name": "ws-bench", "brokers": {"b1": {"unit": "S/c1", "port": gport}}, "links": []}
    path = tmp / "ws-bench.yaml"
    path.write_text(yaml.safe_dump(topology))
    cmd = [*GES, "broker", str(path), "--id", "b1", "--insecure", "--log-level", "warning",
           "--mqtt-port", str(port), "--mqtt-ws-port", str(ws_port), "--data-dir", str(tmp / "d")]  # fmt: skip
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def start_mosquitto(tmp: Path, port: int, ws_port: int) -> subprocess.Popen | None:
    exe = shutil.which("mosquitto") or (
        "/usr/sbin/mosquitto" if Path("/usr/sbin/mosquitto").exists() else None
    )
    if exe is None:
        return None
    conf = tmp / "mosquitto.conf"
    conf.write_text(
        f"per_listener_settings false\nallow_anonymous true\nlistener {port} 127.0.0.1\n"
        f"listener {ws_port} 127.0.0.1\nprotocol websockets\n"
    )
    return subprocess.Popen(
        [exe, "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )


def wait_port(port: int, proc: subprocess.Popen, within: float = 20.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("role", nargs="?", choices=("pub", "sub"))
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--port", type=int)
    ap.add_argument("--ws", action="store_true")
    ap.add_argument("--expect", type=int)
    ap.add_argument("--messages", type=int)
    ap.add_argument("--rate", type=int)
    ap.add_argument("--latency", action="store_true")
    ap.add_argument("--settle", type=float, default=SETTLE, help="seconds after a burst")
    ap.add_argument("--latency-s", type=float, help="seconds of the latency run")
    args = ap.parse_args()
    if args.role == "sub":
        sub_main(args)
        return 0
    if args.role == "pub":
        pub_main(args)
        return 0
    sizes = dict(SIZES["quick" if args.quick else "full"], settle_s=args.settle)
    if args.latency_s:
        sizes["latency_s"] = args.latency_s
    results: dict = {}
    failed = False
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        for name, start in (("ges", start_ges), ("mosquitto", start_mosquitto)):
            port, ws_port = free_ports(2)
            (tmp / name).mkdir()
            proc = start(tmp / name, port, ws_port)
            if proc is None or not (wait_port(port, proc) and wait_port(ws_port, proc)):
                print(
                    f"{name}: not started (not installed, or no WebSockets in its build): skipped",
                    file=sys.stderr,
                )
                if proc is not None:
                    proc.kill()
                continue
            runs: dict = {"tcp": [], "websocket": []}
            try:
                for _ in range(sizes["rounds"]):
                    for transport in ("tcp", "websocket"):
                        ws = transport == "websocket"
                        at = ws_port if ws else port
                        one = run(proc.pid, at, ws, sizes["messages"])
                        time.sleep(args.settle)
                        lat = run(proc.pid, at, ws, int(sizes["latency_s"] * 1000), 1000)
                        one["lost"] += lat["lost"]
                        one |= {k: lat[k] for k in ("p50_us", "p99_us", "max_us") if k in lat}
                        failed |= bool(one["lost"])
                        runs[transport].append(one)
                        print(f"{name} {transport}: {one}", file=sys.stderr)
            finally:
                proc.terminate()
                proc.wait(10)
            results[name] = {t: median(rs) | {"runs": rs} for t, rs in runs.items()}
    fields = ("messages_per_s", "broker_cpu_us_per_message", "p50_us", "p99_us", "max_us")
    for res in results.values():
        res["ratio_websocket_over_tcp"] = {
            f: round(res["websocket"][f] / res["tcp"][f], 3)
            for f in fields
            if res["websocket"].get(f) and res["tcp"].get(f)
        }
    report = {"bench": "websocket", "mode": "quick" if args.quick else "full", "sizes": sizes,
              "baseline": "tcp", "results": results}  # fmt: skip
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{'broker':<10} {'figure':<28} {'TCP':>12} {'WebSocket':>12} {'WS/TCP':>8}")
        for name, res in results.items():
            for f in fields:
                tcp, ws = res["tcp"].get(f), res["websocket"].get(f)
                r = res["ratio_websocket_over_tcp"].get(f)
                print(f"{name:<10} {f:<28} {tcp or '-':>12} {ws or '-':>12} {r or '-':>8}")
    return 1 if failed else 0


def median(runs: list[dict]) -> dict:
    keys = ("messages_per_s", "broker_cpu_us_per_message", "p50_us", "p99_us", "max_us")
    return {
        k: round(statistics.median([r[k] for r in runs if k in r]), 2)
        for k in keys
        if any(k in r for r in runs)
    }


if __name__ == "__main__":
    sys.exit(main())
