"""Frames and message codecs (sans-I/O): the bytes brokers and clients exchange."""

from ges.wire.frames import DEFAULT_MAX_FRAME, PROTOCOL_VERSION, FrameDecoder, FrameError, frame
from ges.wire.messages import (
    MAX_EVENT_BYTES,
    FrameTooLarge,
    decode,
    encode,
    encode_frames,
    event_size,
)

__all__ = [
    "DEFAULT_MAX_FRAME",
    "MAX_EVENT_BYTES",
    "PROTOCOL_VERSION",
    "FrameDecoder",
    "FrameError",
    "FrameTooLarge",
    "decode",
    "encode",
    "encode_frames",
    "event_size",
    "frame",
]
