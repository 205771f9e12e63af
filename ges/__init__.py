"""GES, the Grid Event Service: a content-based publish/subscribe broker network."""

__version__ = "0.1.0"
