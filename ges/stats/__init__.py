"""Batch analytics over broker networks and delivery records, on Apache Spark (``ges stats``).

Seed 004 (Pallickara & Fox, *The Grid Event Service*) asks two questions of a broker network:
how path lengths grow with the network (its small-world argument, §3) and how delivery latency
depends on matching rate, event size, publish rate and hops (its Figure 7 and Table 2).
``ges.stats.paths`` answers the first from topologies, ``ges.stats.latency`` the second from
delivery records (``ges.records``). Both run on a Spark session from ``ges.stats.spark``.

Each job is its own module, with what it returns beside it (``path_results``,
``latency_results``). ``path_bfs`` is the Spark side of ``paths``: the tables, the BFS and the
clustering. ``latency`` reads its input through ``record_input`` (sources, one DataFrame, bad
records named by file and line) and groups by ``group_keys`` (what a ``--by`` name means).
"""
