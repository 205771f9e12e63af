"""The Spark session ``ges stats`` runs on: master, pass-through conf, Java check, progress.

Spark runs in local mode (``local[*]``) by default and on any cluster by ``--master``. Its JVM
logs only errors (``log4j2.properties`` next to this file), the UI is off, and shuffles use a few
partitions unless ``--conf`` says otherwise: the inputs of a single machine are small next to
Spark's defaults, which are sized for clusters.

The JVM is quiet. Two notices are not log4j's to silence: the JVM itself prints "WARNING: Using
incubator modules: jdk.incubator.vector" (Spark's launcher always adds that module), and PySpark's
shell mode prints 'Setting default log level to "WARN"' (the ``org.apache.spark`` logger in
``log4j2.properties`` keeps that one away). So the JVM is started here, not by the builder, with
its stdout and stderr on a pipe that a thread copies to our stderr without the known notices —
stdout stays clean for ``--json`` — and while it starts the lines are held back, so a JVM that
fails to start becomes one ``OperationError`` line quoting its last words.

pyspark (and matplotlib, for plots) come with the ``stats`` extra, not with ``ges`` itself: they
are imported only inside the functions that use them, and :func:`require` turns their absence
into one line saying how to install them, which every ``ges stats`` command checks first.
"""

from __future__ import annotations

import importlib
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path

from ges.errors import OperationError

LOG4J = Path(__file__).with_name("log4j2.properties")

#: Settings a user's ``--conf`` may override.
DEFAULTS = {
    "spark.ui.enabled": "false",
    "spark.sql.shuffle.partitions": "8",
    "spark.sql.adaptive.enabled": "true",
    "spark.driver.memory": "4g",
    "spark.sql.session.timeZone": "UTC",
    "spark.ui.showConsoleProgress": "false",
}


#: How to install what ``ges stats`` needs beyond ``ges`` itself (pyproject's ``stats`` extra).
INSTALL_STATS = "pip install -e '.[stats]' in the ges source tree"


def require(module: str, who: str = "ges stats") -> None:
    """Import ``module`` (pyspark, matplotlib), or raise one OperationError saying how to get it.

    Args:
        module: the top-level module the caller is about to use.
        who: what needs it, as the message starts (``ges stats``, ``--plot``).

    Error handling:
        OperationError (exit 1, like a missing Java): "<who> needs <module>: install the stats
        extra (…)"; when the module is there but fails to import, the import error is quoted.
    """
    try:
        importlib.import_module(module)
    except ImportError as exc:
        why = "" if exc.name == module else f", which failed to import ({exc})"
        raise OperationError(
            f"{who} needs {module}{why}: install the stats extra ({INSTALL_STATS})"
        ) from None


def check_java() -> str:
    """The java executable Spark will start, or one clear OperationError when there is none."""
    home = os.environ.get("JAVA_HOME")
    java = str(Path(home) / "bin" / "java") if home else shutil.which("java")
    if not java or not Path(java).exists():
        where = f"JAVA_HOME={home}" if home else "PATH"
        raise OperationError(
            f"Java not found on {where}: ges stats runs on Apache Spark, which needs Java 17 "
            "(install a JDK, e.g. openjdk-17-jre-headless, or set JAVA_HOME)"
        )
    try:
        subprocess.run([java, "-version"], capture_output=True, check=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        raise OperationError(f"{java}: cannot run Java ({exc}); Spark needs Java 17") from None
    return java


def session(master: str = "local[*]", conf: dict[str, str] | None = None, app: str = "ges-stats"):
    """A SparkSession (the active one if any): the JVM starts on the first call."""
    require("pyspark")
    check_java()
    from pyspark import SparkConf
    from pyspark.sql import SparkSession

    settings = {**DEFAULTS, **(conf or {})}
    log_opt = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    for key in ("spark.driver.extraJavaOptions", "spark.executor.extraJavaOptions"):
        settings[key] = f"{log_opt} {settings[key]}".strip() if key in settings else log_opt
    settings["spark.master"] = master
    settings["spark.app.name"] = app
    _start_jvm(SparkConf(loadDefaults=False).setAll(list(settings.items())), master)
    builder = SparkSession.builder.master(master).appName(app)
    for key, value in settings.items():
        builder = builder.config(key, value)
    try:
        spark = builder.getOrCreate()
    except Exception as exc:  # noqa: BLE001 - a JVM-side failure: one line, not a Py4J traceback
        raise OperationError(
            f"Spark (master {master}) did not start: {failure_reason(exc)}"
        ) from None
    # a failed job is reported as one line (failure_reason); Spark's own ERROR lines would
    # add its stack traces on stderr
    spark.sparkContext.setLogLevel("OFF")
    return spark


#: Lines the JVM prints at start whatever log4j says; dropped from the copy of its stderr.
_NOISE = (
    "WARNING: Using incubator modules:",
    "Setting default log level to",
    "To adjust logging level use sc.setLogLevel",
)
#: Lines of a JVM that failed to start kept for the error message (a JVM that cannot start says
#: why in its first few lines; a stack trace follows).
_STARTUP_LINES = 50
_JAVA_EXCEPTION = re.compile(r'Exception in thread "[^"]*" (?P<type>[\w.$]+): (?P<message>.+)')
#: What a failing JVM says besides the reason: stack frames and its closing boilerplate.
_GENERIC = ("at ", "...", "Caused by", "Error: Could not create", "Error: A fatal exception")


class _Relay:
    """Copies the JVM's output to our stderr, minus :data:`_NOISE`; holds it back until started."""

    def __init__(self, fd: int):
        self.lines: list[str] = []
        self.started = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(
            target=self._run, args=(fd,), name="ges-stats-jvm-output", daemon=True
        )
        self._thread.start()

    def _run(self, fd: int) -> None:
        with os.fdopen(fd, "rb") as pipe:
            for raw in pipe:
                line = raw.decode("utf-8", "replace").rstrip("\r\n")
                if line.startswith(_NOISE):
                    continue
                with self._lock:
                    if not self.started.is_set():
                        self.lines = [*self.lines[-(_STARTUP_LINES - 1) :], line]
                        continue
                _write_stderr(line)

    def release(self) -> None:
        """The JVM is up: print what it said while starting, then copy as it comes."""
        with self._lock:
            for line in self.lines:
                _write_stderr(line)
            self.lines = []
            self.started.set()

    def last_words(self) -> str:
        """Why the JVM exited: its exception's message, or its first line that is not generic."""
        with self._lock:
            said = [line.strip() for line in self.lines if line.strip()]
        for line in said:
            if found := _JAVA_EXCEPTION.match(line):
                return f"{found['message']} ({found['type'].rpartition('.')[2]})"
        for line in said:
            if not line.startswith(_GENERIC):
                return line
        return said[-1] if said else "the JVM exited"


def _write_stderr(line: str) -> None:
    # fd 2, not sys.stderr: a test runner or a rich Live display may have swapped sys.stderr,
    # and the JVM's lines belong where the JVM would have written them.
    with suppress(OSError):
        os.write(2, (line + "\n").encode("utf-8", "replace"))


def _start_jvm(conf, master: str) -> None:
    """Start PySpark's JVM gateway with its output through a :class:`_Relay` (once a process)."""
    from pyspark import SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or "PYSPARK_GATEWAY_PORT" in os.environ:
        return  # already started (by us or by a pyspark shell); the builder reuses it
    read_end, write_end = os.pipe()
    relay = _Relay(read_end)
    try:
        gateway = launch_gateway(conf, popen_kwargs={"stdout": write_end, "stderr": write_end})
    except Exception:  # noqa: BLE001 - pyspark raises its own types for "the JVM exited"
        os.close(write_end)
        relay._thread.join(timeout=5)
        raise OperationError(
            f"Spark (master {master}) did not start: {relay.last_words()}"
        ) from None
    os.close(write_end)  # the JVM holds its own copy; EOF on the relay when it exits
    relay.release()
    SparkContext._ensure_initialized(gateway=gateway, conf=conf)


def failure_reason(exc: BaseException) -> str:
    """One line saying why a Spark call failed: the Java exception's message if there is one."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            message = java.getMessage()
            if message:
                return " ".join(str(message).split())
        except Exception:  # noqa: BLE001 - the gateway may be gone; fall back to the text
            pass
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


class Status:
    """What :func:`progress` yields: ``describe(text)`` changes the label shown beside the bar."""

    def __init__(self, description: str):
        self.description = description

    def describe(self, text: str) -> None:
        self.description = text


@contextmanager
def progress(spark, console, description: str) -> Iterator[Status]:
    """Show Spark's running stages (tasks done of all) on ``console`` while the body runs.

    Polls the status tracker from a thread every 0.2 s; shows nothing when ``console`` is not a
    terminal, so piped and ``--json`` output stay clean. Yields a :class:`Status` whose
    ``describe`` relabels the bar (a job of many Spark jobs can say which step it is on).
    """
    status = Status(description)
    if not console.is_terminal:
        yield status
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    tracker = spark.sparkContext.statusTracker()
    done = threading.Event()
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    ) as bar:
        task = bar.add_task(description, total=None)

        def poll() -> None:
            while not done.wait(0.2):
                total = finished = 0
                stages = []
                for stage_id in tracker.getActiveStageIds():
                    info = tracker.getStageInfo(stage_id)
                    if info is not None:
                        total += info.numTasks
                        finished += info.numCompletedTasks
                        stages.append(str(stage_id))
                label = status.description
                if stages:
                    label += f" (stage {', '.join(stages)})"
                bar.update(task, description=label, total=total or None, completed=finished)

        thread = threading.Thread(target=poll, name="ges-stats-progress", daemon=True)
        thread.start()
        try:
            yield status
        finally:
            done.set()
            thread.join()
