"""XML profiles and events: the examples, round trips, and hostile or wrong documents.

Every rejection must be one ``UserInputError`` line naming the source (and the line where there
is one); hostile documents must be refused quickly, without reading files or the network.
"""

from __future__ import annotations

import math
import resource
import socket
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ges.errors import UserInputError
from ges.matching import xml
from ges.matching.model import (
    OPS,
    ORDERED,
    TOPIC_ATTR,
    TYPE_ATTR,
    Conjunction,
    Constraint,
    Profile,
)
from ges.matching.xml import EventDocument

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((ROOT / "schemas" / "examples").glob("*.xml"))
PASSWD = Path("/etc/passwd")


def profile_doc(body: str, attributes: str = 'id="p"') -> bytes:
    """A profile whose body starts on line 2."""
    return f'<profile xmlns="urn:ges:profile:1" {attributes}>\n{body}\n</profile>\n'.encode()


def event_doc(body: str, attributes: str = 'type="quote"') -> bytes:
    """An event whose body starts on line 2."""
    return f'<event xmlns="urn:ges:event:1" {attributes}>\n{body}\n</event>\n'.encode()


def rejected(data: bytes, parse=xml.parse_profile, source: str = "in.xml") -> str:
    """The one-line message ``parse`` rejects ``data`` with."""
    with pytest.raises(UserInputError) as info:
        parse(data, source)
    message = str(info.value)
    assert "\n" not in message and message.startswith(f"{source}:"), message
    return message


def serialize(doc) -> bytes:
    return xml.profile_to_xml(doc) if isinstance(doc, Profile) else xml.event_to_xml(doc)


# -- examples -------------------------------------------------------------------------------


def test_there_are_examples():
    names = {p.name for p in EXAMPLES}
    assert {"quote-ibm.xml", "quotes-multi.xml", "quote-event.xml", "binary-event.xml"} <= names


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_parses_and_round_trips(path):
    doc = xml.load_document(path)
    again = xml.parse_document(serialize(doc), "again.xml")
    assert again == doc
    assert serialize(again) == serialize(doc)


def test_quote_ibm_example():
    profile = xml.load_profile(ROOT / "schemas/examples/quote-ibm.xml")
    assert profile == Profile(
        "ibm-cheap",
        (Conjunction((Constraint("symbol", "eq", "IBM"), Constraint("price", "lt", 120.0))),),
        "quote",
    )
    assert profile.matches({TYPE_ATTR: "quote", "symbol": "IBM", "price": 119.5})
    assert not profile.matches({TYPE_ATTR: "trade", "symbol": "IBM", "price": 119.5})


def test_quotes_multi_example():
    profile = xml.load_profile(ROOT / "schemas/examples/quotes-multi.xml")
    assert len(profile.conjunctions) == 3
    first = profile.conjunctions[0].constraints
    assert first[0] == Constraint("symbol", "in", ("IBM", "HPQ", "SUNW"))
    assert first[1] == Constraint("volume", "ge", 10000) and type(first[1].value) is int
    assert Constraint("halted", "eq", False) in profile.conjunctions[1].constraints
    ops = {c.op for conj in profile.conjunctions for c in conj.constraints}
    assert {"in", "prefix", "ge", "le", "exists", "ne", "eq", "gt"} <= ops


def test_event_examples():
    quote = xml.load_event(ROOT / "schemas/examples/quote-event.xml")
    assert quote.type == "quote"
    assert quote.attributes == {
        "symbol": "IBM",
        "exchange": "NYSE",
        "price": 119.5,
        "volume": 300,
        "halted": False,
    }
    assert [type(v) for v in quote.attributes.values()] == [str, str, float, int, bool]
    assert quote.payload == b"IBM 119.50 x 300 on NYSE" and quote.payload_encoding == "text"
    assert quote.wire_attributes() == {**quote.attributes, TYPE_ATTR: "quote"}
    binary = xml.load_event(ROOT / "schemas/examples/binary-event.xml")
    assert binary.payload.startswith(b"\x00\x01\x02") and binary.payload_encoding == "base64"


def test_empty_profile_matches_everything():
    profile = xml.parse_profile(profile_doc(""))
    assert profile.conjunctions == (Conjunction(),) and profile.event_type is None
    assert profile.matches({"anything": 1})


def test_schemas_are_namespaced_and_versioned():
    for name, ns in (("profile.xsd", xml.PROFILE_NS), ("event.xsd", xml.EVENT_NS)):
        text = xml._schema_bytes(name).decode()
        assert f'targetNamespace="{ns}"' in text and 'fixed="1"' in text
    assert "version" in rejected(profile_doc("", 'id="p" version="2"'))


def test_pyproject_lists_every_package():
    """The package list is explicit (for ges.schemas), so a new package must be added to it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for top in ("ges", "cli")
        for init in (ROOT / top).rglob("__init__.py")
    }
    assert set(config["packages"]) == found | {"ges.schemas"}
    assert config["package-dir"] == {"ges.schemas": "schemas"}


# -- round trips ----------------------------------------------------------------------------

XML_CHARS = st.characters(
    codec="utf-8",
    exclude_categories=("Cs", "Cc"),
    exclude_characters="\ufffe\uffff",
    include_characters="\t\n\r",
)
TEXT = st.text(XML_CHARS, max_size=12)
IDS = st.text(XML_CHARS, min_size=1, max_size=12)
NAMES = st.from_regex(r"[A-Za-z_][\w.\-]{0,10}", fullmatch=True)
INTS = st.integers(-(2**63), 2**63 - 1)
FLOATS = st.floats(allow_nan=False)  # infinities included
SCALARS = st.one_of(TEXT, INTS, FLOATS, st.booleans())


@st.composite
def constraints(draw) -> Constraint:
    attr, op = draw(NAMES), draw(st.sampled_from(OPS))
    if op == "topic":
        levels = draw(
            st.lists(
                st.one_of(st.just("+"), TEXT.filter(lambda t: not set(t) & set("/+#"))),
                min_size=1,
                max_size=4,
            )
        )
        return Constraint(
            TOPIC_ATTR, op, "/".join(levels + (["#"] if draw(st.booleans()) else [])) or "#"
        )
    if op == "exists":
        return Constraint(attr, op)
    if op == "prefix":
        return Constraint(attr, op, draw(TEXT))
    if op in ORDERED:
        return Constraint(attr, op, draw(st.one_of(TEXT, INTS, FLOATS)))
    if op == "in":
        lists = [st.lists(s, min_size=1, max_size=4) for s in (TEXT, INTS, FLOATS, st.booleans())]
        mixed = st.lists(st.one_of(st.integers(-(2**53), 2**53), FLOATS), min_size=1, max_size=4)
        return Constraint(attr, op, tuple(draw(st.one_of(*lists, mixed))))
    return Constraint(attr, op, draw(SCALARS))


PROFILES = st.builds(
    Profile,
    id=IDS,
    conjunctions=st.lists(
        st.builds(Conjunction, st.lists(constraints(), max_size=4)), min_size=1, max_size=3
    ),
    event_type=st.none() | IDS,
)


def typed(value):
    """A value with its type and exact spelling: 1, 1.0 and True differ, NaN equals NaN."""
    return (type(value).__name__, repr(value))


def profile_key(profile: Profile):
    def value_key(c: Constraint):
        if c.op != "in":
            return typed(c.value)
        if {type(v) for v in c.value} == {int, float}:  # written as a float list
            return tuple(typed(float(v)) for v in c.value)
        return tuple(map(typed, c.value))

    return (
        profile.id,
        profile.event_type,
        [[(c.attr, c.op, value_key(c)) for c in conj.constraints] for conj in profile.conjunctions],
    )


def event_key(doc: EventDocument):
    attributes = [(name, typed(value)) for name, value in doc.attributes.items()]
    return (doc.type, attributes, doc.payload, doc.payload_encoding)


@settings(max_examples=150, deadline=None)
@given(PROFILES)
def test_profile_round_trip(profile):
    data = xml.profile_to_xml(profile)
    again = xml.parse_profile(data, "p.xml")
    assert again == profile
    assert profile_key(again) == profile_key(profile)
    assert xml.profile_to_xml(again) == data


EVENTS = st.builds(
    EventDocument,
    type=IDS,
    attributes=st.dictionaries(
        NAMES, st.one_of(TEXT, INTS, st.floats(), st.booleans()), max_size=5
    ),
    payload=st.one_of(st.binary(max_size=64), TEXT.map(str.encode)),
    payload_encoding=st.sampled_from([None, "text", "base64"]),
)


@settings(max_examples=150, deadline=None)
@given(EVENTS)
def test_event_round_trip(doc):
    data = xml.event_to_xml(doc)
    again = xml.parse_event(data, "e.xml")
    assert event_key(again) == event_key(doc)
    assert xml.event_to_xml(again) == data


def test_event_special_floats_round_trip():
    doc = EventDocument("t", {"a": math.nan, "b": math.inf, "c": -math.inf, "d": -0.0, "e": 0.1})
    again = xml.parse_event(xml.event_to_xml(doc))
    assert math.isnan(again.attributes["a"])
    assert event_key(again) == event_key(doc)


def test_payload_encoding_is_settled_on_creation():
    assert EventDocument("t").payload_encoding is None
    assert EventDocument("t", payload=b"hi").payload_encoding == "text"
    assert (
        EventDocument("t", payload=b"\xff\xfe", payload_encoding="text").payload_encoding
        == "base64"
    )
    assert (
        EventDocument("t", payload=b"a\x01b", payload_encoding="text").payload_encoding == "base64"
    )
    assert EventDocument("t", payload=b"", payload_encoding="text").payload_encoding == "text"
    data = xml.event_to_xml(EventDocument("t", payload=b"\xff" * 100, payload_encoding="text"))
    assert b'encoding="base64"' in data
    assert xml.parse_event(data).payload == b"\xff" * 100


def test_text_is_kept_exactly():
    doc = EventDocument("t", {"s": "  IBM\r\n\t"}, payload=b"line\r\nnext  \n")
    again = xml.parse_event(xml.event_to_xml(doc))
    assert again == doc
    profile = one(Constraint("s", "in", (" a", "b ", "")))
    assert xml.parse_profile(xml.profile_to_xml(profile)) == profile


def test_serialized_form():
    profile = Profile("p", (Conjunction((Constraint("symbol", "eq", "IBM"),)),), "quote")
    data = xml.profile_to_xml(profile)
    assert data.startswith(b"<?xml version='1.0' encoding='UTF-8'?>\n")
    assert b"<all>" not in data and b'\n  <eq attr="symbol" type="string">IBM</eq>\n' in data
    two = Profile("p", (Conjunction(), Conjunction((Constraint("x", "exists"),))))
    assert xml.profile_to_xml(two).count(b"<all") == 2


def one(constraint: Constraint) -> Profile:
    return Profile("p", (Conjunction((constraint,)),))


def test_what_xml_cannot_carry_is_a_value_error():
    with pytest.raises(ValueError, match="U\\+0001"):
        xml.profile_to_xml(one(Constraint("a", "eq", "x\x01")))
    with pytest.raises(ValueError, match="U\\+0000"):
        xml.event_to_xml(EventDocument("t", {"a": "\x00"}))
    with pytest.raises(ValueError, match="exactly"):
        xml.profile_to_xml(one(Constraint("a", "in", (2**60 + 1, 0.5))))
    with pytest.raises(ValueError, match="profile id"):
        xml.profile_to_xml(Profile(""))


# -- hostile documents ----------------------------------------------------------------------

XXE = (
    '<?xml version="1.0"?>\n'
    f'<!DOCTYPE profile [<!ENTITY e SYSTEM "file://{PASSWD}">]>\n'
    '<profile xmlns="urn:ges:profile:1" id="p">\n'
    '  <eq attr="a" type="string">&e;</eq>\n'
    "</profile>\n"
)
LAUGHS = (
    '<?xml version="1.0"?>\n<!DOCTYPE lolz [\n <!ENTITY lol "lol">\n'
    + "".join(
        f' <!ENTITY lol{i} "{f"&lol{i - 1};" * 10 if i > 1 else "&lol;" * 10}">\n'
        for i in range(1, 10)
    )
    + ']>\n<profile xmlns="urn:ges:profile:1" id="&lol9;"/>\n'
)


def in_utf16(document: str) -> bytes:
    return document.replace('"1.0"?>', '"1.0" encoding="UTF-16"?>').encode("utf-16")


def in_utf7(document: str) -> bytes:
    """UTF-7 with every "<!" spelled +ADw-!: the markup hides from a byte scan."""
    document = document.replace('<?xml version="1.0"?>\n', "")
    hidden = document.replace("<!", "+ADw-!")
    assert "<!" not in hidden
    return ('<?xml version="1.0" encoding="UTF-7"?>\n' + hidden).encode("ascii")


def test_xxe_is_refused():
    assert rejected(XXE.encode()) == "in.xml:2: DTDs and entities are not allowed"
    assert rejected(in_utf16(XXE)) == "in.xml:2: DTDs and entities are not allowed"
    # markup the scan cannot see reaches the parser, which must not read the file either
    message = rejected(in_utf7(XXE))
    assert message == "in.xml: DTDs and entities are not allowed"


def test_external_dtd_is_not_loaded(tmp_path):
    dtd = tmp_path / "evil.dtd"
    dtd.write_text("<!ENTITY e 'x'> garbage that fails to parse if anyone reads it <\n")
    document = (
        '<?xml version="1.0"?>\n'
        f'<!DOCTYPE profile SYSTEM "file://{dtd}">\n'
        '<profile xmlns="urn:ges:profile:1" id="p"/>\n'
    )
    assert rejected(document.encode()) == "in.xml:2: DTDs and entities are not allowed"
    # exactly the message of the check after parsing: no load was even attempted
    assert rejected(in_utf7(document)) == "in.xml: DTDs and entities are not allowed"


def test_external_dtd_is_not_fetched():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        listener.setblocking(False)
        port = listener.getsockname()[1]
        document = (
            '<?xml version="1.0"?>\n'
            f'<!DOCTYPE profile SYSTEM "http://127.0.0.1:{port}/evil.dtd">\n'
            '<profile xmlns="urn:ges:profile:1" id="p"/>\n'
        )
        assert "not allowed" in rejected(document.encode())
        assert "not allowed" in rejected(in_utf16(document), xml.parse_document)
        assert "not allowed" in rejected(in_utf7(document), xml.parse_document)
        with pytest.raises(BlockingIOError):
            listener.accept()  # nobody connected


def test_billion_laughs_is_refused_without_expanding():
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert rejected(LAUGHS.encode()) == "in.xml:2: DTDs and entities are not allowed"
    assert rejected(in_utf16(LAUGHS)) == "in.xml:2: DTDs and entities are not allowed"
    assert rejected(in_utf7(LAUGHS)).endswith(
        ": DTDs and entities are not allowed (entity expansion too large)"
    )
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 50 * 1024


def test_huge_file_is_refused_unread(tmp_path, monkeypatch):
    path = tmp_path / "huge.xml"
    with open(path, "wb") as f:
        f.truncate(100 * 1024 * 1024)  # sparse: 100 MB that take no disk
    monkeypatch.setattr(xml, "open", lambda *a, **k: pytest.fail("opened"), raising=False)
    with pytest.raises(UserInputError) as info:
        xml.load_profile(path)
    assert str(info.value) == (
        f"{path}: file is {100 * 1024 * 1024} bytes, over the {xml.MAX_DOCUMENT_BYTES}-byte limit"
    )


def test_reading_stops_at_the_limit():
    """A file whose size stat cannot tell (a device, a pipe) is read up to the limit only."""
    with pytest.raises(UserInputError, match="over the 4194304-byte limit"):
        xml.load_profile("/dev/zero")


def test_huge_document_is_refused_before_parsing():
    data = profile_doc(" " * xml.MAX_DOCUMENT_BYTES)
    assert rejected(data) == (
        f"in.xml: document is {len(data)} bytes, over the {xml.MAX_DOCUMENT_BYTES}-byte limit"
    )


def test_deep_nesting_is_refused():
    deep = profile_doc("<all>\n" * 10_000 + "</all>\n" * 10_000)
    message = rejected(deep)
    assert message.endswith(": elements nested deeper than 32")
    assert "malformed" not in message  # the document is well-formed, only too deep
    assert int(message.split(":")[1]) > 200  # where libxml2 gave up
    # under libxml2's own limit, our bound still holds and names the element's line
    assert rejected(profile_doc("<all>\n" * 40 + "</all>\n" * 40)) == (
        "in.xml:33: elements nested deeper than 32"
    )


def test_malformed_xml_names_the_line():
    data = profile_doc('  <eq attr="a" type="string">x</eq>\n  <lt attr="b" type="int">3\n')
    message = rejected(data)
    assert message.startswith("in.xml:5: malformed XML: Opening and ending tag mismatch: lt line 3")
    assert rejected(b"") == "in.xml:1: malformed XML: Document is empty"
    assert rejected(profile_doc("&nope;")).startswith("in.xml:2: malformed XML: Entity 'nope'")


@pytest.mark.parametrize(
    ("body", "line", "words"),
    [
        ('  <eq attr="a" type="int">1</eq>\n  <like attr="a" type="string">x</like>', 3, "'like'"),
        ('  <eq attr="a">1</eq>', 2, "'type' is required"),
        ('  <in attr="a" type="int"/>', 2, "Missing child element"),
        ('  <eq attr="a" type="int">1</eq>\n  <all><exists attr="b"/></all>', 3, "'all'"),
        ('  <all><exists attr="b"/></all>\n  <exists attr="a"/>', 3, "'exists'"),
        ('  <exists attr="a" type="int"/>', 2, "'type' is not allowed"),
        ('  <eq attr="9a" type="int">1</eq>', 2, "'9a'"),
        ('  <eq attr="a" type="decimal">1</eq>', 2, "'decimal'"),
        ('  <in attr="a" type="int">1</in>', 2, "not allowed"),
    ],
)
def test_schema_violations_name_the_line(body, line, words):
    message = rejected(profile_doc(body))
    assert message.startswith(f"in.xml:{line}: Element ") and words in message
    assert "{urn:" not in message


def test_profile_attributes_are_checked():
    assert "'id' is required" in rejected(profile_doc("", ""))
    assert "in.xml:1: " in rejected(profile_doc("", 'id=""'))
    assert "in.xml:1: " in rejected(profile_doc("", 'id="p" event-type=""'))


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ('<lt attr="price" type="int">abc</lt>', 3, "lt price: 'abc' is not an int"),
        ('<lt attr="price" type="int">1_000</lt>', 3, "lt price: '1_000' is not an int"),
        ('<lt attr="price" type="int">2</lt>', None, None),
        ('<eq attr="n" type="int">9223372036854775808</eq>', 3, "outside the signed 64-bit"),
        ('<eq attr="price" type="float">NaN</eq>', 3, "eq: NaN is not a constraint value"),
        ('<eq attr="price" type="float">1e999</eq>', 3, "out of the float range"),
        ('<eq attr="price" type="float">1,5</eq>', 3, "'1,5' is not a float"),
        ('<prefix attr="symbol" type="int">1</prefix>', 3, "prefix: needs a string value"),
        ('<lt attr="halted" type="bool">true</lt>', 3, "lt: booleans are not ordered"),
        ('<eq attr="halted" type="bool">yes</eq>', 3, "'yes' is not a bool"),
        (
            '<in attr="v" type="int">\n<value>1</value>\n<value>x</value></in>',
            5,
            "'x' is not an int",
        ),
        ('<eq attr="s" type="string">' + "x" * 65537 + "</eq>", 3, "over 65536 characters"),
    ],
)
def test_values_are_checked_against_their_type(body, line, message):
    data = profile_doc(f'  <exists attr="a"/>\n  {body}')
    if message is None:
        assert xml.parse_profile(data).conjunctions[0].constraints[1].value == 2
    else:
        assert rejected(data).startswith(f"in.xml:{line}: ") and message in rejected(data)


@pytest.mark.parametrize(
    ("text", "type_name", "value"),
    [
        (" 42 ", "int", 42),
        ("+7", "int", 7),
        ("007", "int", 7),
        ("-0009223372036854775807", "int", -(2**63) + 1),
        ("-9223372036854775808", "int", -(2**63)),
        ("\n1.5e3\t", "float", 1500.0),
        (".5", "float", 0.5),
        ("5.", "float", 5.0),
        ("-0", "float", -0.0),
        ("INF", "float", math.inf),
        ("-INF", "float", -math.inf),
        ("true", "bool", True),
        (" 0 ", "bool", False),
        ("1", "bool", True),
        (" padded ", "string", " padded "),
        ("", "string", ""),
    ],
)
def test_value_spellings(text, type_name, value):
    constraint = f'<eq attr="a" type="{type_name}">{text}</eq>'
    got = xml.parse_profile(profile_doc(constraint)).conjunctions[0].constraints[0].value
    assert typed(got) == typed(value)
    event = xml.parse_event(event_doc(f'<attr name="a" type="{type_name}">{text}</attr>'))
    assert typed(event.attributes["a"]) == typed(value)


# -- events ---------------------------------------------------------------------------------


def test_event_duplicate_attribute():
    body = '  <attr name="symbol" type="string">IBM</attr>\n  <attr name="symbol" type="string">HPQ</attr>'
    message = rejected(event_doc(body), xml.parse_event)
    assert message == "in.xml:3: duplicate attribute 'symbol' (first on line 2)"


@pytest.mark.parametrize(
    ("body", "line", "message"),
    [
        ('<payload encoding="base64">not base64!</payload>', 2, "payload: not valid base64"),
        ('<payload encoding="base64">QUI</payload>', 2, "payload: not valid base64"),
        ('<payload encoding="base64">QU=I</payload>', 2, "payload: not valid base64"),
        ('<payload encoding="base64">QUJé</payload>', 2, "payload: not valid base64"),
        ('<attr name="n" type="int">1.5</attr>', 2, "n: '1.5' is not an int"),
        ('<attr name="b" type="bool">True</attr>', 2, "b: 'True' is not a bool"),
        ('<attr name="f" type="float">fast</attr>', 2, "f: 'fast' is not a float"),
        ('<payload encoding="gzip">x</payload>', 2, "'gzip'"),
        ('<payload>x</payload>\n<attr name="a" type="int">1</attr>', 3, "'attr'"),
    ],
)
def test_event_errors(body, line, message):
    got = rejected(event_doc(body), xml.parse_event)
    assert got.startswith(f"in.xml:{line}: ") and message in got


def test_event_values():
    body = (
        '<attr name="f" type="float">NaN</attr><attr name="b" type="bool">1</attr>'
        '<payload encoding="base64">\n  QUJD\n  REVG\n</payload>'
    )
    doc = xml.parse_event(event_doc(body))
    assert math.isnan(doc.attributes["f"]) and doc.attributes["b"] is True
    assert doc.payload == b"ABCDEF" and doc.payload_encoding == "base64"
    assert xml.parse_event(event_doc("<payload/>")).payload_encoding == "text"
    assert "'type' is required" in rejected(event_doc("", ""), xml.parse_event)


def test_event_document_validates():
    with pytest.raises(ValueError):
        EventDocument("")
    with pytest.raises(ValueError):
        EventDocument("t", {"@type": "x"})
    with pytest.raises(ValueError):
        EventDocument("t", {"a": None})
    with pytest.raises(ValueError):
        EventDocument("t", payload_encoding="gzip")


# -- dispatch and files ---------------------------------------------------------------------


def test_parse_document_dispatches():
    assert isinstance(xml.parse_document(profile_doc("")), Profile)
    assert isinstance(xml.parse_document(event_doc("")), EventDocument)
    assert rejected(b"<x/>", xml.parse_document) == (
        "in.xml:1: not a GES profile or event (root element x)"
    )
    assert rejected(b'<p xmlns="urn:other"/>', xml.parse_document) == (
        "in.xml:1: not a GES profile or event (root element {urn:other}p)"
    )
    assert rejected(event_doc("")) == (
        "in.xml:1: not a GES profile (root element {urn:ges:event:1}event)"
    )
    assert rejected(b'<profile id="p"/>').endswith('expected xmlns="urn:ges:profile:1"')


def test_file_errors(tmp_path):
    with pytest.raises(UserInputError, match=r"^.*missing\.xml: no such file$"):
        xml.load_profile(tmp_path / "missing.xml")
    with pytest.raises(UserInputError, match="is a directory"):
        xml.load_event(tmp_path)
    path = tmp_path / "bad.xml"
    path.write_bytes(profile_doc('  <lt attr="price" type="int">abc</lt>'))
    with pytest.raises(UserInputError) as info:
        xml.load_document(path)
    assert str(info.value) == f"{path}:2: lt price: 'abc' is not an int"
