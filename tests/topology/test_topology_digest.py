"""``Topology.digest``: the same for the same network however its file is written, different
for every fact that makes it another network."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from ges.topology import Topology

ROOT = Path(__file__).resolve().parents[2]

BASE = """\
name: digest-test
block_limit: 8
brokers:
  b1: {unit: S/c1, host: 127.0.0.1, port: 7101}
  b2: {unit: S/c1, port: 7102}
  b3: {unit: S/c2, port: 7103}
  b4: {unit: S/c2, port: 7104}
links:
  - [b1, b2]
  - [b2, b3, {cost: 3}]
  - [b3, b4]
  - [b1, b4]
replicators:
  - {unit: S/c1, broker: b1}
  - {unit: S/c2, broker: b4}
link_costs: [[1, 5]]
"""

#: The same network written differently: another name, keys in another order, comments, the
#: brokers, links, link ends and replicators in another order, the default host spelt out, and
#: whole-number costs written as floats.
REWRITTEN = """\
# a comment before everything
link_costs: [[1.0, 5.0]]
replicators:
  - {broker: b4, unit: S/c2}   # order swapped
  - {broker: b1, unit: S/c1}
links:
  - [b4, b1]
  - [b4, b3]
  - [b3, b2, {cost: 3.0}]
  - [b2, b1]
brokers:
  b4: {port: 7104, unit: S/c2}
  b3: {unit: S/c2, port: 7103, host: 127.0.0.1}
  b2: {port: 7102, unit: S/c1}
  b1: {port: 7101, unit: S/c1}
block_limit: 8
name: another-name
"""


def digest_of(text: str, tmp_path: Path, name: str = "t.yaml") -> Topology:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return Topology.from_yaml(path)


def test_digest_is_sha256_hex_and_short_digest_its_prefix(tmp_path):
    t = digest_of(BASE, tmp_path)
    assert re.fullmatch(r"[0-9a-f]{64}", t.digest)
    assert t.short_digest == t.digest[:16]
    assert t.digest is t.digest  # computed once: the same string object, not an equal one


def test_digest_is_the_same_for_the_same_network_written_differently(tmp_path):
    base = digest_of(BASE, tmp_path, "a.yaml")
    other = digest_of(REWRITTEN, tmp_path / "..", "elsewhere.yaml")
    assert other.name != base.name and other.source != base.source
    assert other.digest == base.digest
    # and the dict form, and the default matrix entry written out
    assert Topology.from_dict(base.to_dict()).digest == base.digest
    spelt_out = BASE.replace("link_costs: [[1, 5]]", "link_costs: [[1, 5], [2, 3, 4]]")
    assert digest_of(spelt_out, tmp_path, "c.yaml").digest == base.digest


def test_digest_does_not_depend_on_the_process():
    """A fixed file gives a fixed digest: no hash seeds, no dict order, no memory addresses.

    If this fails because the canonical form changed on purpose, bump DIGEST_FORMAT too.
    """
    t = Topology.from_yaml_text(BASE)
    assert t.digest == "0d3c1e90824d0cb5d41c53651f8b691429a9b1c027ac0b4725b3baf58fdeed3f"


CHANGES = {
    "broker moves unit": ("b2: {unit: S/c1, port: 7102}", "b2: {unit: S/c2, port: 7102}"),
    "broker moves port": ("b2: {unit: S/c1, port: 7102}", "b2: {unit: S/c1, port: 7202}"),
    "broker moves host": (
        "b2: {unit: S/c1, port: 7102}",
        "b2: {unit: S/c1, port: 7102, host: 127.0.0.2}",
    ),
    "broker renamed": ("b2: {unit: S/c1, port: 7102}", "b9: {unit: S/c1, port: 7102}"),
    "link added": ("  - [b1, b4]\n", "  - [b1, b4]\n  - [b1, b3]\n"),
    "link removed": ("  - [b1, b4]\n", ""),
    "link cost changed": ("{cost: 3}", "{cost: 4}"),
    "link cost removed": ("[b2, b3, {cost: 3}]", "[b2, b3]"),
    "link cost added": ("[b3, b4]", "[b3, b4, {cost: 2}]"),
    "block limit": ("block_limit: 8", "block_limit: 9"),
    "link cost matrix": ("link_costs: [[1, 5]]", "link_costs: [[1, 6]]"),
    "replicator moved": ("{unit: S/c2, broker: b4}", "{unit: S/c2, broker: b3}"),
    "replicator removed": ("  - {unit: S/c2, broker: b4}\n", ""),
}


@pytest.mark.parametrize("change", sorted(CHANGES))
def test_digest_changes_with_every_fact(tmp_path, change):
    old, new = CHANGES[change]
    assert old in BASE
    text = BASE.replace(old, new)
    if change == "broker renamed":
        text = text.replace("[b1, b2]", "[b1, b9]").replace("[b2, b3,", "[b9, b3,")
    changed = digest_of(text, tmp_path)
    assert changed.digest != Topology.from_yaml_text(BASE).digest


def test_every_change_gives_its_own_digest(tmp_path):
    texts = [BASE.replace(*CHANGES[c]) for c in sorted(CHANGES) if c != "broker renamed"]
    digests = {digest_of(text, tmp_path).digest for text in texts}
    assert len(digests) == len(texts)


def test_digest_of_the_ready_topologies_differ():
    digests = {Topology.from_yaml(p).digest for p in sorted((ROOT / "topologies").glob("*.yaml"))}
    assert len(digests) == len(list((ROOT / "topologies").glob("*.yaml")))


def test_topology_check_prints_the_digest(ges, write):
    path = write(BASE)
    want = Topology.from_yaml(path)
    text = ges("topology", "check", path)
    assert text.exit_code == 0, text.output
    assert f"digest {want.short_digest}" in text.stdout
    result = ges("topology", "check", path, "--json")
    assert result.exit_code == 0, result.output
    (entry,) = json.loads(result.stdout)["files"]
    assert entry["digest"] == want.digest
