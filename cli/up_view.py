"""``ges up`` on a terminal: the network in a thread, the interactive view of ``ges monitor``
in front.

Textual wants the main thread (its asyncio loop, the terminal, the keys); the brokers are trio
tasks. So the network's ``trio.run`` goes to a thread of its own, as the view's reports already
do (ges.monitor.app), and the three meet only through thread-safe calls: the view stops the
network with ``trio.from_thread.run_sync`` on its cancel scope, the network stops the view
with ``call_from_thread``. Signals are the main thread's: Ctrl-C is a key of the view (the
terminal is in raw mode), SIGTERM is turned into the view's exit, and while the network is
still starting both stop it. The brokers' log goes to a file (the view owns the terminal);
their info and warning lines also come to the view's event log in their reports.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from pathlib import Path

import trio

from cli._common import err
from ges.monitor.app import MonitorApp
from ges.monitor.live import Monitor


def up_with_view(run, monitor: Monitor, log_file: Path) -> None:
    """``run(beside=…)``: the network (cli.network._run_up); returns when both have stopped.

    Raises what the network raised (an OperationError: one line, exit 1)."""
    box: dict = {}
    ready = threading.Event()

    def beside(scope) -> None:
        if scope is not None:  # the start: how to stop it from the main thread
            box["scope"], box["token"] = scope, trio.lowlevel.current_trio_token()
        else:
            ready.set()

    def network() -> None:
        try:
            trio.run(lambda: run(beside=beside))
        except BaseException as exc:  # noqa: BLE001 - raised again on the main thread
            box["error"] = exc
        finally:
            box["done"] = True
            ready.set()
            app = box.get("app")
            if app is not None:  # the network ended on its own: so does the view
                with contextlib.suppress(RuntimeError):
                    app.call_from_thread(app.exit)

    def stop() -> None:
        if "token" in box:
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(box["scope"].cancel, trio_token=box["token"])

    thread = threading.Thread(target=network, name="ges-up-network")
    previous = signal.getsignal(signal.SIGTERM)
    signal.signal(signal.SIGTERM, lambda *_: _interrupt())
    try:
        thread.start()
        try:
            while not ready.wait(0.1):
                pass
        except KeyboardInterrupt:  # Ctrl-C or SIGTERM while it starts
            stop()
            thread.join()
            _raise(box)
            return
        if box.get("done"):
            thread.join()
            _raise(box)
            return
        app = box["app"] = MonitorApp(monitor)
        signal.signal(signal.SIGTERM, lambda *_: _exit_soon(app))
        app.run()
        stop()
        thread.join()
    finally:
        signal.signal(signal.SIGTERM, previous)
    err.print(f"the brokers' log: {log_file}", highlight=False, soft_wrap=True)
    _raise(box)


def _interrupt() -> None:
    raise KeyboardInterrupt


def _exit_soon(app: MonitorApp) -> None:
    """From a signal handler: ask the view to exit from another thread (thread-safe)."""
    threading.Thread(target=_call, args=(app,), daemon=True).start()


def _call(app: MonitorApp) -> None:
    with contextlib.suppress(RuntimeError):
        app.call_from_thread(app.exit)


def _raise(box: dict) -> None:
    error = box.get("error")
    if error is not None and not isinstance(error, KeyboardInterrupt):
        raise error
