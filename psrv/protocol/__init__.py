"""Wire protocol: message types and the one codec pair (encode -> frames, decode)."""
from psrv.protocol.codec import decode, encode
from psrv.protocol.messages import PROTOCOL_VERSION, ErrorCode, Message, MsgType, ProtocolError

__all__ = ["PROTOCOL_VERSION", "ErrorCode", "Message", "MsgType", "ProtocolError", "decode", "encode"]
