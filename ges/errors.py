"""The few exceptions GES raises to its users.

``UserInputError`` means the user's input is wrong (exit code 2); ``OperationError`` means the
operation failed although the input was fine (exit code 1). Both carry a one-line message that
names the place (file and line, broker, link) and the problem; the CLI prints exactly that line.
"""

from __future__ import annotations


class GesError(Exception):
    """Base of every error GES reports to a user as one line."""

    exit_code = 1


class UserInputError(GesError):
    """The user's input (a file, a flag, an id) is wrong; exit code 2."""

    exit_code = 2


class OperationError(GesError):
    """The operation failed for a reason outside the input (timeout, peer unreachable); exit 1."""

    exit_code = 1


class PermissionDenied(OperationError):
    """A broker refused a request the client's roles do not allow (ges.security.access)."""


class BrokerUnreachable(OperationError):
    """No broker answered a connection at its address (nothing listening, no route, timeout)."""


def find_ges_error(exc: BaseException) -> GesError | None:
    """The first GesError inside ``exc``, looking through (nested) exception groups.

    trio nurseries wrap a task's exception in an ExceptionGroup; the user should still see the
    one line it carries.
    """
    if isinstance(exc, GesError):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            found = find_ges_error(inner)
            if found is not None:
                return found
    return None
