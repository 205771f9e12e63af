"""The XML schemas (XSD 1.0) for GES profiles and events, shipped as package data of ``ges.schemas``."""
