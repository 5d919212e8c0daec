"""A run's history read back: DIR/history/*.jsonl, one process life per file, one event per line
(docs/history.md). Only a file's last line may be torn; a torn line anywhere else is a corrupt history."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# the fields the checker reads, by event kind and by who records it (docs/history.md's tables)
WORKER_FIELDS = {"start": ("w",), "push": ("w", "seq", "shard", "clock"),
                 "ack": ("w", "seq", "shard", "epoch", "dropped"), "pull": ("w", "seq", "shard", "clock", "epoch")}
REPLICA_FIELDS = {"start": ("role", "shard", "address"), "epoch": ("epoch", "role"), "sent_state": ("to", "n"),
                  "state": ("from", "n"), "apply": ("w", "seq", "clock", "version"),
                  "drop": ("w", "seq", "clock", "why"), "commit": ("clock", "version", "pushed", "need"),
                  "member": ("w", "what"), "ack": ("w", "seq", "epoch"), "answer": ("w", "seq", "clock"),
                  "fenced": ("epoch",)}


class HistoryError(ValueError):
    """The history cannot be checked (missing, corrupt, incomplete): bad input, not a violation."""


@dataclass(frozen=True)
class Event:
    """One line of one file: where it is (the file's name, its 1-based line) and what it says."""
    file: str
    line: int
    fields: dict[str, Any]

    @property
    def ev(self) -> str:
        return self.fields["ev"]

    @property
    def t(self) -> float:
        return self.fields["t"]

    def __getitem__(self, key: str) -> Any:
        return self.fields[key]

    def get(self, key: str, default: Any = None) -> Any:
        return self.fields.get(key, default)

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}"

    def text(self) -> str:
        return json.dumps(self.fields, separators=(", ", ": "))


@dataclass
class ProcessLog:
    """One process life's file: a worker's (`rank`) or a replica's (`shard`, `address`, first `role`)."""
    file: str
    events: list[Event]
    torn: bool = False  # its last line was torn (the process died writing it) and is skipped
    role: str = field(init=False)

    def __post_init__(self) -> None:
        self.role = self.events[0]["role"]

    @property
    def is_worker(self) -> bool:
        return self.role == "worker"

    @property
    def rank(self) -> int:
        return self.events[0]["w"]

    @property
    def shard(self) -> int:
        return self.events[0]["shard"]

    @property
    def address(self) -> str:
        return self.events[0]["address"]

    @property
    def started(self) -> float:
        return self.events[0].t


def _parse(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_log(path: Path) -> ProcessLog | None:
    """The file's events; None for a file with no whole line (its process died before its first event).
    HistoryError for a line that is not a whole event anywhere but at the end, or an event that lacks a field."""
    lines = path.read_bytes().decode("utf-8", errors="replace").split("\n")
    if lines and lines[-1] == "":
        lines.pop()  # the newline that ends the last whole line
    events, torn = [], False
    for number, text in enumerate(lines, start=1):
        fields = _parse(text)
        if fields is None:
            if number == len(lines):
                torn = True
                break
            raise HistoryError(f"{path.name}:{number}: not a whole JSON event, and only a file's last line may be "
                               "torn (a process killed while writing it): the history is corrupt")
        events.append(Event(path.name, number, fields))
    if not events:
        return None
    _check_fields(path.name, events)
    return ProcessLog(path.name, events, torn)


def _check_fields(name: str, events: list[Event]) -> None:
    first = events[0]
    if first.get("ev") != "start" or first.get("role") not in ("worker", "primary", "backup"):
        raise HistoryError(f"{first.where}: a history file must begin with a `start` event with role worker, "
                           "primary or backup")
    table = WORKER_FIELDS if first["role"] == "worker" else REPLICA_FIELDS
    for e in events:
        if "ev" not in e.fields or not isinstance(e.get("t"), (int, float)):
            raise HistoryError(f"{e.where}: an event needs `ev` and a numeric `t`: {e.text()}")
        missing = [k for k in table.get(e.ev, ()) if k not in e.fields]
        if missing:
            raise HistoryError(f"{e.where}: a `{e.ev}` event without {', '.join(f'`{k}`' for k in missing)}: "
                               f"{e.text()}")


def read_history(folder: Path) -> list[ProcessLog]:
    """Every process life recorded in `folder` (DIR/history), by file name; HistoryError if it holds none."""
    if not folder.is_dir():
        raise HistoryError(f"{folder} does not exist: the run recorded no history (psrv run sets PSRV_HISTORY "
                           "to DIR/history for every process it starts)")
    logs = [log for path in sorted(folder.glob("*.jsonl")) if (log := read_log(path)) is not None]
    if not logs:
        raise HistoryError(f"{folder} holds no events (no *.jsonl file with a whole line)")
    return logs
