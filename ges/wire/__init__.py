"""Frames and message codecs (sans-I/O): the bytes brokers and clients exchange."""

from ges.wire.frames import DEFAULT_MAX_FRAME, PROTOCOL_VERSION, FrameDecoder, FrameError, frame
from ges.wire.messages import decode, encode

__all__ = [
    "DEFAULT_MAX_FRAME",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "FrameError",
    "decode",
    "encode",
    "frame",
]
