"""Profiles and events: the value model, XML in and out, the profile graph, covering."""

from ges.matching.graph import ProfileGraph
from ges.matching.model import Conjunction, Constraint, Profile
from ges.matching.syntax import parse_attr, parse_value, parse_where

__all__ = [
    "Conjunction",
    "Constraint",
    "Profile",
    "ProfileGraph",
    "parse_attr",
    "parse_value",
    "parse_where",
]
