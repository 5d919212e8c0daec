"""Whether the device a config names is here: checked by psrv's entry points before anything starts.

The config tree checks a device's spelling (cpu, cuda, cuda:K); only this machine can say whether it
has one. torch is imported only when a cuda device is asked for, so a cpu run stays quick to refuse.
"""
from __future__ import annotations


def check_device(device: str, *, option: str = "--device") -> None:
    """ValueError naming `option` unless `device` can be used here: cpu always; cuda or cuda:K when
    torch sees a CUDA device (K below their count)."""
    if not device.startswith("cuda"):
        return
    import torch
    if not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "built without CUDA"
        raise ValueError(f"{option} {device}: torch sees no CUDA device on this machine (torch "
                         f"{torch.__version__}, {built}); use {option} cpu")
    index = int(device[5:]) if device.startswith("cuda:") else 0
    count = torch.cuda.device_count()
    if index >= count:
        raise ValueError(f"{option} {device}: this machine has {count} CUDA device"
                         f"{'s' if count != 1 else ''} (cuda:0..cuda:{count - 1})")
