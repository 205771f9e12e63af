"""The README's Quick start is exactly two commands, and `.ci/run` runs the second as written."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def quick_start_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Quick start", 1)[1]
    block = re.search(r"```(?:sh|bash)?\n(.*?)```", section, re.S)
    assert block, "README Quick start has no code block"
    return [line for line in block.group(1).splitlines() if line.strip()]


def test_quick_start_has_exactly_two_commands():
    commands = quick_start_commands()
    assert len(commands) == 2
    assert "ges up" in commands[0]
    assert "pytest" in commands[1]


def test_quick_start_installs_the_stats_extra():
    # pip has no default extras: the demo's install names the one ges stats needs (pyproject)
    assert "-e '.[stats]'" in quick_start_commands()[0]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    body = [ln for ln in ci if ln.strip() and not ln.startswith("#")]
    test_command = quick_start_commands()[1]
    assert test_command in body, f".ci/run does not run {test_command!r}"
