"""One Spark session for every ``ges stats`` test: the JVM starts once per test worker (the
suite runs on two, pytest-xdist; a test file stays on one).

Java 17 is part of what the project needs (README); without it these tests fail with
``ges.stats.spark.check_java``'s one line rather than being skipped.
"""

from __future__ import annotations

import pytest

from ges.stats import spark as sparkjob


@pytest.fixture(scope="session")
def spark():
    """A local SparkSession on two cores."""
    session = sparkjob.session("local[2]")
    yield session
    session.stop()
