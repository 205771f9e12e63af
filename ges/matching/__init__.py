"""Profiles and events: attribute filters today; XML profiles and the profile graph next."""

from ges.matching.filter import Filter, parse_attr, parse_value, parse_where

__all__ = ["Filter", "parse_attr", "parse_value", "parse_where"]
