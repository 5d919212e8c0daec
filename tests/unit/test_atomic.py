"""psrv/atomic.py: the one way psrv writes a file that someone else reads."""
from __future__ import annotations

import json

import pytest

from psrv.atomic import replacing, write_json


def test_a_write_that_fails_half_way_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "record.json"
    write_json(path, {"steps": 1})
    with pytest.raises(RuntimeError):
        with replacing(path) as f:
            f.write('{"steps": ')
            raise RuntimeError("killed mid-write")
    assert json.loads(path.read_text()) == {"steps": 1}
    assert [p.name for p in tmp_path.iterdir()] == ["record.json"]


def test_a_durable_write_replaces_the_file_and_creates_its_folder(tmp_path):
    path = tmp_path / "a" / "b" / "ckpt"
    with replacing(path, "wb", durable=True) as f:
        f.write(b"one")
        assert not path.exists(), "the file appeared before its write ended"
    with replacing(path, "wb", durable=True) as f:
        f.write(b"two")
    assert path.read_bytes() == b"two" and sorted(p.name for p in path.parent.iterdir()) == ["ckpt"]
