"""Pushes held back while another worker's chunked push is half applied (psrv/server/pushes/chunked.py).

A shard applies a chunked push chunk by chunk as it arrives. Were a second worker's push applied in
between, some elements would take it before the first push and others after, which no order of
whole pushes gives (and both pushes would take the same Adam step count). So while a push is open,
the other workers' PUSH and PUSH_PULL messages wait here, in arrival order, and are handled once it
ends: the shard applies pushes one at a time, in the order their first message arrived, exactly as
whole pushes. What waits costs what it would cost whole (a worker has one push in flight).

A message's tensor views what its transport received, valid until the transport's next receive where a
plane lent it (psrv/transport/plane.py): a backup's payloads are its primary's forward slots, which the
primary writes again once the backup's loop moves on, so a backup keeps what it holds (`keep`: a copy).
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Hashable

from psrv.protocol import Message


class HeldPushes:
    def __init__(self) -> None:
        self._items: deque[tuple[Hashable, Message]] = deque()
        self._own: set[int] = set()  # id() of the messages held whose tensors are their own (keep)

    def __len__(self) -> int:
        return len(self._items)

    def hold(self, peer: Hashable, msg: Message) -> None:
        self._items.append((peer, msg))

    def keep(self) -> None:
        """Give every message held its own copy of its tensors (those it has already are left alone)."""
        for _, msg in self._items:
            if id(msg) in self._own:
                continue
            if msg.tensor is not None:
                msg.tensor = msg.tensor.clone()
            if msg.parts is not None:
                msg.parts = {name: part.clone() for name, part in msg.parts.items()}
            self._own.add(id(msg))

    def holding(self, worker: int, seq) -> bool:
        """Is a message of this request here (a client's probe: then it waits, and does not re-send)?"""
        return any(m.worker == worker and m.seq == seq for _, m in self._items)

    def drop(self, worker: int) -> None:
        """`worker` left or restarted: what it sent before is void."""
        self._items = deque(item for item in self._items if item[1].worker != worker)
        self._own &= {id(msg) for _, msg in self._items}

    def next(self, blocked: Callable[[int], bool]) -> tuple[Hashable, Message] | None:
        """The first message whose worker is not `blocked` now, taken out; None when every one is."""
        for i, (peer, msg) in enumerate(self._items):
            if not blocked(msg.worker):
                del self._items[i]
                self._own.discard(id(msg))
                return peer, msg
        return None
