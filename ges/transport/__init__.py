"""Framed TCP connections over trio, shared by the broker runtime and the client library.

The one I/O layer below both: :mod:`ges.transport.connection` is a connection with a send
queue bounded in bytes and deadlines in time. It knows frames (ges.wire), not brokers or clients.
"""
