"""A ^C that reaches a command as its network stops (a second one, in a task that was
closing: wrapped in trio's exception groups) ends it with 130 and no traceback, as a ^C does
anywhere else; a group holding anything else is not taken for one."""

from __future__ import annotations

import pytest
import typer

from cli._common import one_line_errors


def _raising(exc: BaseException):
    @one_line_errors
    def command():
        raise exc

    return command


@pytest.mark.parametrize(
    "exc",
    [
        KeyboardInterrupt(),
        BaseExceptionGroup("nursery", [KeyboardInterrupt()]),
        BaseExceptionGroup("up", [BaseExceptionGroup("broker", [KeyboardInterrupt()])]),
    ],
)
def test_an_interrupt_however_wrapped_exits_130(exc):
    with pytest.raises(typer.Exit) as got:
        _raising(exc)()
    assert got.value.exit_code == 130


def test_a_group_with_more_than_interrupts_is_not_swallowed():
    group = BaseExceptionGroup("nursery", [KeyboardInterrupt(), RuntimeError("a bug")])
    with pytest.raises(BaseExceptionGroup):
        _raising(group)()
