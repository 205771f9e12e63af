"""``ges monitor --once`` in-process against brokers running in a thread of the test: the unit
tree with its health, the links as both ends report them, and one line for bad input."""

from __future__ import annotations

import json

from tests.cli.test_link import ges, one_error_line, running


def once(path, *extra, interval: str = "0.2") -> dict:
    result = ges("monitor", path, "--once", "--json", "--interval", interval, "--insecure", *extra)
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def brokers_of(unit: dict) -> dict:
    out = {b["broker"]: b for b in unit["brokers"]}
    for inner in unit["units"]:
        out |= brokers_of(inner)
    return out


def test_a_healthy_network_is_one_tree_of_units_all_ok(diamond_file):
    with running(diamond_file):
        snap = once(diamond_file)
    net = snap["network"]
    assert snap["topology"] == "diamond" and net["health"] == "ok"
    (s,) = net["units"]
    assert s["unit"] == "S" and [u["unit"] for u in s["units"]] == ["S/c1", "S/c2"]
    assert [b["broker"] for b in s["units"][0]["brokers"]] == ["a", "b"]
    assert net["answering"] == net["members"] == 4
    assert {link["state"] for link in snap["links"]} == {"up"}
    assert {(link["a"], link["b"]): link["level"] for link in snap["links"]}[("a", "c")] == 1
    assert all(b["links_up"] and b["clients"] == 0 for b in brokers_of(net).values())


def test_brokers_not_running_and_a_cut_link_show_in_health_links_and_log(diamond_file):
    with running(diamond_file, only=["a", "b", "c"]):
        assert ges("link", "down", diamond_file, "a", "c", "--insecure").exit_code == 0
        # (an interval of 1 s: at 0.2 s, a broker of a loaded CI machine was once slower to
        # answer being asked directly than the snapshot waits, and shown as not answering)
        snap = once(diamond_file, interval="1")
        text = ges("monitor", diamond_file, "--once", "--interval", "1", "--insecure")
    net = snap["network"]
    by_unit = {u["unit"]: u for u in net["units"][0]["units"]}
    assert by_unit["S/c1"]["health"] == "ok"
    assert by_unit["S/c2"]["health"] == "some down"
    # c answers but reaches neither a (cut) nor d (not running): S is split
    assert net["units"][0]["health"] == "split"
    links = {(link["a"], link["b"]): link["state"] for link in snap["links"]}
    assert links == {("a", "b"): "up", ("a", "c"): "cut", ("b", "d"): "down", ("c", "d"): "down"}
    d = brokers_of(net)["d"]
    assert not d["answering"] and "cannot reach broker" in d["error"]  # asked directly
    assert snap["through"] == "a"  # the first broker of the topology that answers
    assert any(e["text"].startswith("d does not answer") for e in snap["log"])
    assert text.exit_code == 0, text.stderr
    assert "split" in text.stdout and "a–c" in text.stdout and "cut" in text.stdout


def test_no_broker_answering_and_bad_options_are_one_line_each(diamond_file):
    result = ges("monitor", diamond_file, "--once", "--interval", "0.1", "--insecure")
    assert result.exit_code == 1
    assert one_error_line(result) == "error: no broker of diamond answers"
    result = ges("monitor", diamond_file, "--json", "--insecure")
    assert result.exit_code != 0
    assert "--json: only with --once" in one_error_line(result)
    result = ges("monitor", diamond_file, "--once", "--interval", "0", "--insecure")
    assert "--interval 0: must be from 0.1 to 60 s" in one_error_line(result)
    result = ges("monitor", diamond_file, "--once", "--broker", "zz", "--insecure")
    assert one_error_line(result) == "error: --broker zz: not a broker of diamond"
