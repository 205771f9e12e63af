"""XML profiles and events: the human and interchange format at GES's edges (DESIGN).

A document goes through four gates, and any failure is one ``UserInputError`` line
``SOURCE:LINE: WHAT``:

1. size: over ``MAX_DOCUMENT_BYTES`` is refused before parsing (files: before reading);
2. a hardened lxml parser: no DTD (a ``<!DOCTYPE``/``<!ENTITY`` anywhere is refused), no entity
   expansion, no network, no processing instructions, nesting at most ``MAX_DEPTH`` deep;
3. the XSD for the root element (``schemas/profile.xsd``, ``schemas/event.xsd``, namespaces
   ``urn:ges:profile:1`` and ``urn:ges:event:1``);
4. what XSD 1.0 cannot say — a value against its ``type`` attribute, the model's own rules
   (``prefix`` takes strings, booleans are not ordered, ...), unique event attribute names.

lxml objects stop here: parsing returns a :class:`~ges.matching.model.Profile` or an
:class:`EventDocument`, and serializing takes them back to pretty-printed bytes such that
``parse(serialize(x)) == x``.
"""

from __future__ import annotations

import base64
import binascii
import math
import os
import re
import stat
from importlib import resources
from pathlib import Path
from typing import NoReturn

import attrs
from lxml import etree

from ges.errors import UserInputError
from ges.matching.model import (
    INT_MAX,
    INT_MIN,
    MAX_NAME,
    NAME,
    TOPIC_ATTR,
    TYPE_ATTR,
    Conjunction,
    Constraint,
    Profile,
    Value,
    kind,
)

PROFILE_NS = "urn:ges:profile:1"
EVENT_NS = "urn:ges:event:1"
#: The format version; the roots may carry it as ``version="1"`` (the schemas fix it).
FORMAT_VERSION = "1"

#: A document larger than this is refused unread: the largest profile the model admits
#: (1024 conjunctions of 256 constraints) does not fit, but real profiles and events are a few
#: kilobytes, and this keeps a stray huge file from costing memory.
MAX_DOCUMENT_BYTES = 4 * 1024 * 1024
#: Deepest element nesting accepted. GES documents are at most 4 deep (profile/all/in/value);
#: libxml2 would stop only at 256.
MAX_DEPTH = 32
#: Base64 payloads are written in lines of this many characters (as MIME does).
BASE64_LINE = 76

_PROFILE = f"{{{PROFILE_NS}}}profile"
_ALL = f"{{{PROFILE_NS}}}all"
_VALUE = f"{{{PROFILE_NS}}}value"
_EVENT = f"{{{EVENT_NS}}}event"
_ATTR = f"{{{EVENT_NS}}}attr"
_PAYLOAD = f"{{{EVENT_NS}}}payload"

_NO_DTD = "DTDs and entities are not allowed"


class _Refused(Exception):
    """Raised by :class:`_RefuseAll` out of the parser: something asked for an external file."""


class _RefuseAll(etree.Resolver):
    """Refuses every external DTD or entity, whatever the scheme.

    Defence in depth: with the options below libxml2 loads nothing (``no_network`` alone would
    still allow ``file:``). Note ``collect_ids=False`` must stay unset: in lxml it makes libxml2
    read a document's external DTD subset.
    """

    def resolve(self, system_url, public_id, context):
        raise _Refused(system_url)


_PARSER = etree.XMLParser(
    resolve_entities=False,
    no_network=True,
    load_dtd=False,
    dtd_validation=False,
    huge_tree=False,
    remove_pis=True,
    remove_comments=True,
    attribute_defaults=False,
)
_PARSER.resolvers.add(_RefuseAll())

#: Characters outside XML 1.0's Char production: they cannot be written in a document.
_NOT_XML = re.compile("[^\t\n\r\x20-\ud7ff\ue000-\ufffd\U00010000-\U0010ffff]")
#: How UTF-16 and UTF-32 documents start (XML 1.0 appendix F), longest first: with or
#: without a byte order mark, followed by "<".
_WIDE_ENCODINGS = (
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\x00<", "utf-32-be"),
    (b"<\x00\x00\x00", "utf-32-le"),
    (b"\xfe\xff", "utf-16-be"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\x00<", "utf-16-be"),
    (b"<\x00", "utf-16-le"),
)
_XML_SPACE = " \t\n\r"
_XML_SPACES = re.compile("[ \t\n\r]+")
_INT = re.compile(r"[+-]?[0-9]+")
_DECIMAL = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
#: xs:double's special values, plus Python's spellings of them.
_SPECIAL_FLOATS = {
    "INF": math.inf,
    "+INF": math.inf,
    "-INF": -math.inf,
    "NaN": math.nan,
    "inf": math.inf,
    "+inf": math.inf,
    "-inf": -math.inf,
    "nan": math.nan,
}
_BOOLS = {"true": True, "1": True, "false": False, "0": False}
_LIBXML_WHERE = re.compile(r",? line \d+, column \d+$")


# -- errors -------------------------------------------------------------------------------


def _one_line(text: str) -> str:
    """Newlines and unprintable characters escaped: a message never spans two lines."""
    text = text.strip()
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _fail(source: str, line: int | None, what: str) -> NoReturn:
    where = f"{source}:{line}" if line else source
    raise UserInputError(f"{where}: {_one_line(what)}")


# -- schemas ------------------------------------------------------------------------------

_schemas: dict[str, etree.XMLSchema] = {}


def _schema_bytes(name: str) -> bytes:
    try:
        return resources.files("ges.schemas").joinpath(name).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError):
        # a source checkout that was never installed: the repository's schemas/ directory
        return (Path(__file__).resolve().parents[2] / "schemas" / name).read_bytes()


def _schema(name: str) -> etree.XMLSchema:
    """The compiled XSD ``name`` ("profile.xsd" or "event.xsd"), loaded once."""
    compiled = _schemas.get(name)
    if compiled is None:
        doc = etree.fromstring(_schema_bytes(name), _PARSER, base_url=name)
        compiled = _schemas[name] = etree.XMLSchema(doc)
    return compiled


# -- parsing: the gates -------------------------------------------------------------------


def _scan_text(data: bytes) -> str:
    """The document as text for the DTD scan: UTF-16/32 decoded, anything else byte for byte."""
    for prefix, codec in _WIDE_ENCODINGS:
        if data.startswith(prefix):
            return data.decode(codec, errors="replace")
    return data.decode("latin-1")  # markup is ASCII in UTF-8 and every ASCII-based encoding


def _parse_xml(data: bytes, source: str) -> etree._Element:
    """Gates 1 and 2: size, no DTD, well-formed, not too deep. Returns the root element."""
    if isinstance(data, bytearray | memoryview):
        data = bytes(data)
    if not isinstance(data, bytes):
        raise TypeError(f"XML documents are bytes, not {type(data).__name__}")
    if len(data) > MAX_DOCUMENT_BYTES:
        _fail(
            source, None, f"document is {len(data)} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit"
        )
    text = _scan_text(data)
    for marker in ("<!DOCTYPE", "<!ENTITY"):
        at = text.find(marker)
        if at >= 0:
            _fail(source, text.count("\n", 0, at) + 1, _NO_DTD)
    try:
        root = etree.fromstring(data, _PARSER)
    except _Refused as exc:
        _fail(source, None, f"{_NO_DTD} (refused to load {exc})")
    except etree.XMLSyntaxError as exc:
        message = _LIBXML_WHERE.sub("", exc.msg or "not well-formed")
        if message.startswith("Excessive depth"):
            _fail(source, exc.lineno or 1, f"elements nested deeper than {MAX_DEPTH}")
        if message.startswith("Maximum entity amplification"):  # a DTD the scan missed
            _fail(source, exc.lineno, f"{_NO_DTD} (entity expansion too large)")
        _fail(source, exc.lineno or 1, f"malformed XML: {message}")
    info = root.getroottree().docinfo
    if info.doctype or info.internalDTD is not None or info.externalDTD is not None:
        # an encoding that hides the markup from the scan (UTF-7, ...); nothing was loaded
        _fail(source, None, _NO_DTD)
    depth = 0
    for event, element in etree.iterwalk(root, events=("start", "end")):
        depth += 1 if event == "start" else -1
        if depth > MAX_DEPTH:
            _fail(source, element.sourceline, f"elements nested deeper than {MAX_DEPTH}")
    return root


def _validate(root: etree._Element, schema_name: str, source: str) -> None:
    """Gate 3: the schema. Reports the validator's first complaint."""
    xsd = _schema(schema_name)
    if not xsd.validate(root):
        entry = xsd.error_log[0]
        # the validator names every element {namespace}name; in one document that is noise
        message = entry.message.replace(f"{{{PROFILE_NS}}}", "").replace(f"{{{EVENT_NS}}}", "")
        _fail(source, entry.line, message)


def _root_name(root: etree._Element) -> str:
    return root.tag if isinstance(root.tag, str) else repr(root.tag)


def _expect_root(root: etree._Element, tag: str, what: str, source: str) -> None:
    if root.tag != tag:
        hint = ""
        if etree.QName(root).localname == etree.QName(tag).localname:
            hint = f'; expected xmlns="{etree.QName(tag).namespace}"'
        _fail(source, root.sourceline, f"not a GES {what} (root element {_root_name(root)}){hint}")


# -- parsing: values ----------------------------------------------------------------------


def _convert(text: str, type_name: str, what: str) -> Value:
    """Gate 4a: the text of a value as its ``type``; raises ValueError naming ``what``."""
    if type_name == "string":
        return text
    text = text.strip(_XML_SPACE)
    if type_name == "int":
        # int() alone would also take "1_000" and non-ASCII digits
        if not _INT.fullmatch(text):
            raise ValueError(f"{what}: {text!r} is not an int")
        # (the length test first: int() of a few thousand digits is refused, or slow)
        if len(text.lstrip("+-").lstrip("0")) > 19 or not INT_MIN <= int(text) <= INT_MAX:
            raise ValueError(f"{what}: {text} is outside the signed 64-bit range")
        return int(text)
    if type_name == "float":
        special = _SPECIAL_FLOATS.get(text)
        if special is not None:
            return special
        if not _DECIMAL.fullmatch(text):
            raise ValueError(f"{what}: {text!r} is not a float")
        value = float(text)
        if math.isinf(value):
            raise ValueError(f"{what}: {text} is out of the float range (write INF for infinity)")
        return value
    if type_name == "bool":
        try:
            return _BOOLS[text]
        except KeyError:
            raise ValueError(f"{what}: {text!r} is not a bool (true, false, 1 or 0)") from None
    raise AssertionError(type_name)  # the schema admits only the four


def _op(element: etree._Element) -> str:
    return etree.QName(element).localname


def _constraint(element: etree._Element, source: str) -> Constraint:
    op, attr, type_name = _op(element), element.get("attr"), element.get("type")
    what = f"{op} {attr}"
    try:
        if op == "topic":
            return Constraint(TOPIC_ATTR, op, element.text or "")
        if op == "exists":
            return Constraint(attr, op)
        if op == "in":
            values = []
            for child in element.iterchildren(_VALUE):
                try:
                    values.append(_convert(child.text or "", type_name, what))
                except ValueError as exc:
                    _fail(source, child.sourceline, str(exc))
            return Constraint(attr, op, tuple(values))
        return Constraint(attr, op, _convert(element.text or "", type_name, what))
    except ValueError as exc:
        _fail(source, element.sourceline, str(exc))


def _profile(root: etree._Element, source: str) -> Profile:
    children = list(root)
    if children and children[0].tag == _ALL:
        conjunctions = [Conjunction(_constraint(c, source) for c in group) for group in children]
    else:
        conjunctions = [Conjunction(_constraint(c, source) for c in children)]
    try:
        return Profile(root.get("id"), conjunctions, root.get("event-type"))
    except ValueError as exc:
        _fail(source, root.sourceline, str(exc))


# -- events -------------------------------------------------------------------------------


def _text_safe(payload: bytes) -> bool:
    """Can ``payload`` be written as an XML text payload (UTF-8, XML characters only)?"""
    try:
        text = payload.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _NOT_XML.search(text) is None


@attrs.frozen
class EventDocument:
    """An event as written in XML: its type, typed attributes (in document order), a payload.

    ``payload_encoding`` is how the payload is written: ``"text"``, ``"base64"``, or None for no
    payload element. It is settled on creation so that serializing round-trips: a non-empty
    payload without one gets ``"text"`` when that is possible, and a ``"text"`` payload that is
    not UTF-8 or holds characters XML cannot carry becomes ``"base64"``.
    """

    type: str
    attributes: dict[str, Value] = attrs.field(factory=dict, converter=dict, eq=True, hash=False)
    payload: bytes = attrs.field(default=b"", validator=attrs.validators.instance_of(bytes))
    payload_encoding: str | None = None

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.type, str) or not 0 < len(self.type) <= MAX_NAME:
            raise ValueError(
                f"event type {self.type!r} must be a string of 1 to {MAX_NAME} characters"
            )
        for name, value in self.attributes.items():
            if not isinstance(name, str) or len(name) > MAX_NAME or not NAME.fullmatch(name):
                raise ValueError(f"attribute name {name!r} must match [A-Za-z_][\\w.-]*")
            if kind(value) is None:
                raise ValueError(f"attribute {name}: {value!r} is not a string, number or boolean")
        encoding = self.payload_encoding
        if encoding not in (None, "text", "base64"):
            raise ValueError(f"payload encoding {encoding!r} is not text or base64")
        if encoding == "text" or (encoding is None and self.payload):
            encoding = "text" if _text_safe(self.payload) else "base64"
        object.__setattr__(self, "payload_encoding", encoding)

    def wire_attributes(self) -> dict[str, Value]:
        """The attributes as they travel: the type rides along as ``TYPE_ATTR``."""
        return {**self.attributes, TYPE_ATTR: self.type}


def _event(root: etree._Element, source: str) -> EventDocument:
    attributes: dict[str, Value] = {}
    lines: dict[str, int] = {}
    payload, encoding = b"", None
    for element in root:
        if element.tag == _ATTR:
            name = element.get("name")
            if name in lines:
                _fail(
                    source,
                    element.sourceline,
                    f"duplicate attribute {name!r} (first on line {lines[name]})",
                )
            lines[name] = element.sourceline
            try:
                attributes[name] = _convert(element.text or "", element.get("type"), name)
            except ValueError as exc:
                _fail(source, element.sourceline, str(exc))
        else:  # the schema admits only <payload> after the attributes
            encoding = element.get("encoding", "text")
            text = element.text or ""
            if encoding == "text":
                payload = text.encode("utf-8")
            else:
                try:
                    payload = binascii.a2b_base64(_XML_SPACES.sub("", text), strict_mode=True)
                except ValueError as exc:  # binascii.Error, or not ASCII
                    _fail(source, element.sourceline, f"payload: not valid base64 ({exc})")
    try:
        return EventDocument(root.get("type"), attributes, payload, encoding)
    except ValueError as exc:
        _fail(source, root.sourceline, str(exc))


# -- public parsing -----------------------------------------------------------------------


def parse_profile(data: bytes, source: str = "<profile>") -> Profile:
    """Parse and validate a profile document; every problem is one ``UserInputError`` line."""
    root = _parse_xml(data, source)
    _expect_root(root, _PROFILE, "profile", source)
    _validate(root, "profile.xsd", source)
    return _profile(root, source)


def parse_event(data: bytes, source: str = "<event>") -> EventDocument:
    """Parse and validate an event document; every problem is one ``UserInputError`` line."""
    root = _parse_xml(data, source)
    _expect_root(root, _EVENT, "event", source)
    _validate(root, "event.xsd", source)
    return _event(root, source)


def parse_document(data: bytes, source: str = "<xml>") -> Profile | EventDocument:
    """A profile or an event, whichever the root element says."""
    root = _parse_xml(data, source)
    if root.tag == _PROFILE:
        _validate(root, "profile.xsd", source)
        return _profile(root, source)
    if root.tag == _EVENT:
        _validate(root, "event.xsd", source)
        return _event(root, source)
    _fail(source, root.sourceline, f"not a GES profile or event (root element {_root_name(root)})")


def _read(path) -> tuple[bytes, str]:
    """A file's bytes, refusing anything over ``MAX_DOCUMENT_BYTES`` without reading it."""
    source = os.fspath(path)
    try:
        info = os.stat(path)
        if stat.S_ISDIR(info.st_mode):
            _fail(source, None, "is a directory, expected an XML file")
        if info.st_size > MAX_DOCUMENT_BYTES:
            _fail(
                source,
                None,
                f"file is {info.st_size} bytes, over the {MAX_DOCUMENT_BYTES}-byte limit",
            )
        with open(path, "rb") as f:
            data = f.read(MAX_DOCUMENT_BYTES + 1)  # a file may grow after stat, or lie in it
    except FileNotFoundError:
        _fail(source, None, "no such file")
    except OSError as exc:
        _fail(source, None, f"cannot read: {exc.strerror or exc}")
    if len(data) > MAX_DOCUMENT_BYTES:
        _fail(source, None, f"file is over the {MAX_DOCUMENT_BYTES}-byte limit")
    return data, source


def load_profile(path: str | os.PathLike) -> Profile:
    """Read and parse a profile file (see :func:`parse_profile`)."""
    return parse_profile(*_read(path))


def load_event(path: str | os.PathLike) -> EventDocument:
    """Read and parse an event file (see :func:`parse_event`)."""
    return parse_event(*_read(path))


def load_document(path: str | os.PathLike) -> Profile | EventDocument:
    """Read and parse a profile or an event file (see :func:`parse_document`)."""
    return parse_document(*_read(path))


# -- serializing --------------------------------------------------------------------------


def _xml_text(text: str, what: str) -> str:
    bad = _NOT_XML.search(text)
    if bad:
        raise ValueError(f"{what}: character U+{ord(bad.group()):04X} cannot be written in XML")
    return text


def _name_text(text: str, what: str) -> str:
    if not 0 < len(text) <= MAX_NAME:
        raise ValueError(f"{what} {text!r}: must be 1 to {MAX_NAME} characters")
    return _xml_text(text, what)


def _float_text(value: float) -> str:
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "INF" if value > 0 else "-INF"
    return repr(value)  # the shortest text that reads back as the same float


def _type_name(value: Value) -> str:
    return {bool: "bool", int: "int", float: "float", str: "string"}[type(value)]


def _value_text(value: Value, what: str) -> str:
    if type(value) is bool:
        return "true" if value else "false"
    if type(value) is float:
        return _float_text(value)
    if type(value) is int:
        return str(value)
    return _xml_text(value, what)


def _in_type(c: Constraint) -> str:
    types = {_type_name(v) for v in c.value}
    if types != {"int", "float"}:
        return types.pop()
    # numbers of both kinds share one list: written as floats, which must lose nothing
    for v in c.value:
        if type(v) is int and float(v) != v:
            raise ValueError(f"in {c.attr}: {v} cannot be written exactly in a list with floats")
    return "float"


def _write_constraint(parent: etree._Element, c: Constraint) -> None:
    tag = f"{{{PROFILE_NS}}}{c.op}"
    what = f"{c.op} {c.attr}"
    if c.op == "topic":
        etree.SubElement(parent, tag).text = _xml_text(c.value, what)
    elif c.op == "exists":
        etree.SubElement(parent, tag, {"attr": c.attr})
    elif c.op == "in":
        type_name = _in_type(c)
        element = etree.SubElement(parent, tag, {"attr": c.attr, "type": type_name})
        for v in c.value:
            v = float(v) if type_name == "float" else v
            etree.SubElement(element, _VALUE).text = _value_text(v, what)
    else:
        element = etree.SubElement(parent, tag, {"attr": c.attr, "type": _type_name(c.value)})
        element.text = _value_text(c.value, what)


def _to_bytes(root: etree._Element) -> bytes:
    return etree.tostring(root, xml_declaration=True, encoding="UTF-8", pretty_print=True)


def profile_to_xml(profile: Profile) -> bytes:
    """A profile as a pretty-printed document; one conjunction is written without ``<all>``.

    Raises ValueError for what XML cannot carry: control characters in strings, or an int in a
    mixed int/float ``in`` list that a float cannot hold exactly.
    """
    root = etree.Element(_PROFILE, nsmap={None: PROFILE_NS})
    root.set("id", _name_text(profile.id, "profile id"))
    if profile.event_type is not None:
        root.set("event-type", _name_text(profile.event_type, "event type"))
    root.set("version", FORMAT_VERSION)
    if len(profile.conjunctions) == 1:
        for c in profile.conjunctions[0].constraints:
            _write_constraint(root, c)
    else:
        for conjunction in profile.conjunctions:
            group = etree.SubElement(root, _ALL)
            for c in conjunction.constraints:
                _write_constraint(group, c)
    return _to_bytes(root)


def event_to_xml(doc: EventDocument) -> bytes:
    """An event as a pretty-printed document. Raises ValueError for control characters in strings."""
    root = etree.Element(_EVENT, nsmap={None: EVENT_NS})
    root.set("type", _xml_text(doc.type, "event type"))
    root.set("version", FORMAT_VERSION)
    for name, value in doc.attributes.items():
        element = etree.SubElement(root, _ATTR, {"name": name, "type": _type_name(value)})
        element.text = _value_text(value, name)
    if doc.payload_encoding is not None:
        element = etree.SubElement(root, _PAYLOAD, {"encoding": doc.payload_encoding})
        if doc.payload_encoding == "text":
            element.text = doc.payload.decode("utf-8")
        else:
            encoded = base64.b64encode(doc.payload).decode("ascii")
            element.text = "\n".join(
                encoded[i : i + BASE64_LINE] for i in range(0, len(encoded), BASE64_LINE)
            )
    return _to_bytes(root)
