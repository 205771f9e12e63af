"""The asks of what is retained a broker's clients make (ges.durable.retained), and their
answers: half of :class:`ges.runtime.sessions.SessionDesk`.

Theory of operation
-------------------
An MQTT SUBSCRIBE asks for what is retained on its filters (ges.mqtt.filtering), one ask at
a time per client. Every retained message reaches every replicator, so a broker asks its home
replicator: its own core when it is one, else over its follow connection to it
(ges.runtime.sessions), which carries the asks of all its clients.

The replicator bounds the asks waiting to be answered (ges.core.retaining): MAX_WAITING_BYTES
of filters from one connection, and MAX_ALL_WAITING_BYTES from all together. A following
broker therefore sends its clients' asks in turn, within MAX_WAITING_BYTES unanswered, and
holds back up to MAX_HELD_ASKS_BYTES more. An ask larger than a replicator takes from one
connection is refused here at once.

A refusal for the bound on all (``Error.retry``) happens when many brokers' clients subscribe
at once, as after a restart. That ask goes back in line in the order asked, and the asks
wait ASK_AGAIN_AFTER, then go one at a time while refusals last. After ASK_AGAIN_FOR the ask
is refused. An MQTT client of the replicator's own broker has its ask made again the same
way.

A refused ask is logged where the client is: MQTT has no way to tell a client that its
SUBSCRIBE got nothing retained.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import msgspec
import trio

from ges.core import ToClient
from ges.core.retaining import MAX_WAITING_BYTES, ask_size
from ges.wire import messages as m

if TYPE_CHECKING:
    from ges.runtime.sessions import Follow

#: Bytes of asks of what is retained (as ges.core.retaining counts them) a follow connection
#: holds back, beyond those sent (ges.core.retaining.MAX_WAITING_BYTES): past this, an ask is
#: answered an Error here. Each MQTT client has one ask at a time.
MAX_HELD_ASKS_BYTES = 16 << 20
#: An ask the replicator refused for now (``Error.retry``: over its bound on all connections'
#: asks, ges.core.retaining.MAX_ALL_WAITING_BYTES — many brokers' clients subscribing at once,
#: as after a restart) is asked again after this many seconds, in the order asked, for at
#: most ASK_AGAIN_FOR seconds; then its client's SUBSCRIBE gets nothing retained (logged).
ASK_AGAIN_AFTER = 0.5
ASK_AGAIN_FOR = 30.0

_DIGITS = re.compile(r"\d+")


class RetainedAsking:
    """Asks of what is retained, for :class:`ges.runtime.sessions.SessionDesk` (its
    ``server``, ``core``, ``home``, ``_follow``, ``_reqs`` and ``_send``)."""

    async def _retained(self, conn_id: int, msg: m.RetainedAsk) -> list:
        """What is retained on a client's filters (ges.durable.retained): asked of this
        broker's home replicator, which every retained message reaches."""
        if self.server.is_follower(conn_id) or self.home == self.id:
            replicator = self.core.replicator
            if replicator is None:
                reason = f"broker {self.id} keeps no retained messages (it is not a replicator)"
                return self._not_retained(conn_id, msg.req, reason)
            outs = replicator.retained_ask(conn_id, msg)
            if self.server.is_follower(conn_id):
                return outs
            if self.server.is_mqtt(conn_id) and any(
                type(out.msg) is m.Error and out.msg.retry for out in outs
            ):  # an MQTT client here, refused for now: asked again (it cannot be told)
                self.server._nursery.start_soon(self._ask_here_later, conn_id, msg)
                return []
            for out in outs:
                if type(out.msg) is m.Error:
                    self._log_not_retained(conn_id, out.msg.reason)
            return outs
        size = ask_size(msg)
        if size > MAX_WAITING_BYTES:  # the replicator takes no ask this large
            reason = (
                f"retained messages: an ask of {size} bytes of topic filters, over the "
                f"{MAX_WAITING_BYTES} a replicator takes"
            )
            return self._not_retained(conn_id, msg.req, reason)
        follow = await self._follow(self.home)
        if not self.server.is_client(conn_id):  # it went meanwhile (the follow may take 5 s)
            return []
        if follow.conn is None:
            reason = f"retained messages: replicator {self.home} is unreachable: {follow.failed}"
            return self._not_retained(conn_id, msg.req, reason)
        if any(ask[0] == conn_id for ask in follow.asking.values()):
            reason = "retained messages: one ask at a time (the last is not answered yet)"
            return self._not_retained(conn_id, msg.req, reason)
        if follow.waiting_bytes + size > MAX_HELD_ASKS_BYTES:
            reason = (
                f"retained messages: {follow.waiting_bytes} bytes of topic filters already wait "
                f"at broker {self.id} to be asked of replicator {self.home}"
            )
            return self._not_retained(conn_id, msg.req, reason)
        req = next(self._reqs)
        follow.asks[req] = follow.asking[req] = [conn_id, msg.req, None, None]
        follow.waiting.append((req, msgspec.structs.replace(msg, req=req), size))
        follow.waiting_bytes += size
        self._send_asks(follow)
        return []

    def _not_retained(self, conn_id: int, req: int, reason: str) -> list:
        """A client's ask of what is retained refused: logged, and answered."""
        self._log_not_retained(conn_id, reason)
        return [ToClient(conn_id, m.Error(reason, req=req))]

    def _log_not_retained(self, conn_id: int, reason: str) -> None:
        """An MQTT client's SUBSCRIBE gets nothing retained, and MQTT has no way to tell it:
        the log says why (once per cause, then summarised)."""
        self.server.notes.warning(
            "retained refused " + _DIGITS.sub("N", reason)[:80],
            "client %s: nothing retained sent for its SUBSCRIBE: %s",
            self.core.client_name(conn_id),
            reason,
        )

    def _send_asks(self, follow: Follow) -> None:
        """Send the asks of what is retained waiting for ``follow``'s replicator, in order,
        while those unanswered stay within what it lets one connection have waiting
        (MAX_WAITING_BYTES; one at least): a follow connection carries the asks of every MQTT
        client of this broker, and an ask past that bound would be refused — its SUBSCRIBE
        would get nothing retained."""
        waiting = follow.waiting
        while waiting and not follow.pausing:
            req, ask, size = waiting[0]
            if follow.ask_bytes and (  # one at a time while the replicator refuses for now
                follow.refused_since or follow.ask_bytes + size > MAX_WAITING_BYTES
            ):
                return
            waiting.popleft()
            follow.waiting_bytes -= size
            if req not in follow.asks:
                continue  # its client went meanwhile
            follow.sent[req] = (ask, size)
            follow.ask_bytes += size
            self._send(follow, ask)

    def _ask_again(self, follow: Follow, req: int, ask: m.RetainedAsk, size: int, why: str):
        """The replicator refused ask ``req`` for now (``Error.retry``): it goes back in line in
        the order asked (ahead of those never sent), and the asks wait ASK_AGAIN_AFTER, then go
        one at a time while refusals last; after ASK_AGAIN_FOR of that, it is refused."""
        now = trio.current_time()
        since = follow.refused_since.setdefault(req, now)
        if now - since >= ASK_AGAIN_FOR:
            del follow.refused_since[req]
            del follow.asking[req]
            client, client_req = follow.asks.pop(req)[:2]
            self._send_asks(follow)
            return self._not_retained(client, client_req, f"{why} (refused for {ASK_AGAIN_FOR:g}s)")
        waiting = follow.waiting  # back in line by number (first come, first asked again)
        at = 0
        while at < len(waiting) and waiting[at][0] < req:
            at += 1
        waiting.insert(at, (req, ask, size))
        follow.waiting_bytes += size
        if not follow.pausing:
            follow.pausing = True
            self.server._nursery.start_soon(self._ask_later, follow)
        return []

    async def _ask_later(self, follow: Follow) -> None:
        await trio.sleep(ASK_AGAIN_AFTER)
        follow.pausing = False
        self._send_asks(follow)

    async def _ask_here_later(self, conn_id: int, msg: m.RetainedAsk) -> None:
        """An MQTT client of the replicator's own broker, its ask refused for now: asked
        again every ASK_AGAIN_AFTER while it stays, for at most ASK_AGAIN_FOR (as a
        follower asks for its clients). Its session asks one at a time: one of these each."""
        since = trio.current_time()
        while True:
            await trio.sleep(ASK_AGAIN_AFTER)
            if not self.server.is_mqtt(conn_id):  # gone
                return
            outs = self.core.replicator.retained_ask(conn_id, msg)
            refused = [out.msg for out in outs if type(out.msg) is m.Error]
            if refused and refused[0].retry and trio.current_time() - since < ASK_AGAIN_FOR:
                continue
            for error in refused:
                why = error.reason + (f" (refused for {ASK_AGAIN_FOR:g}s)" * error.retry)
                self._log_not_retained(conn_id, why)
            await self.server._dispatch(outs)
            return

    def _ask_answered(self, follow: Follow, msg) -> list | None:
        """The replicator answered ``msg.req``: if it was an ask of what is retained, its
        bytes make room for the next; one refused for now is asked again, one refused is
        logged. The outputs then (a refusal's), or None: the answer goes on to its client as
        any other does."""
        sent = follow.sent.pop(msg.req, None)
        if sent is None:
            return None
        ask, size = sent
        follow.ask_bytes -= size
        refused = type(msg) is m.Error
        if refused and msg.retry and msg.req in follow.asking:
            return self._ask_again(follow, msg.req, ask, size, msg.reason)
        follow.refused_since.pop(msg.req, None)
        follow.asking.pop(msg.req, None)
        self._send_asks(follow)
        if not refused:
            return None
        entry = follow.asks.pop(msg.req, None)
        return [] if entry is None else self._not_retained(entry[0], entry[1], msg.reason)

    def _forget_all_asks(self, follow: Follow) -> None:
        """``follow``'s connection is gone: every ask of what is retained on it with it (their
        clients were told, as those of any request on it)."""
        follow.asking.clear()
        follow.sent.clear()
        follow.refused_since.clear()
        follow.waiting.clear()
        follow.ask_bytes = follow.waiting_bytes = 0

    def _forget_asks(self, follow: Follow, conn_id: int) -> None:
        """Client ``conn_id`` went: its ask of what is retained is no longer waited for (one
        sent still counts its bytes until answered; one not sent yet is not asked)."""
        for req in [r for r, ask in follow.asking.items() if ask[0] == conn_id]:
            del follow.asking[req]
            follow.refused_since.pop(req, None)
            if req not in follow.sent:
                for i, (waiting, _, size) in enumerate(follow.waiting):
                    if waiting == req:
                        del follow.waiting[i]
                        follow.waiting_bytes -= size
                        break
