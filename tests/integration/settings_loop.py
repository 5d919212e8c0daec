"""A script for `psrv run --script` that passes psrv.Worker no settings of its own but those on its command
line (test_script_settings.py): the run's worker settings reach it through PSRV_CONFIG. It steps its own
inner optimizer before ps.step(), as local steps need, for PSRV_STEPS steps.

    python tests/integration/settings_loop.py [KEYWORD=VALUE ...]

KEYWORD=VALUE: a keyword psrv.Worker is given explicitly (VALUE an int where it reads as one).
"""
import os
import sys

import torch

import psrv


def _value(text: str):
    try:
        return int(text)
    except ValueError:
        return text


def main(words: list[str]) -> None:
    given = {key: _value(value) for key, _, value in (w.partition("=") for w in words)}
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))  # 4096: compressed
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1 + int(os.environ["RANK"]))
    with psrv.Worker(net, **given) as ps:
        while ps.steps < int(os.environ["PSRV_STEPS"]):
            x = torch.randn(8, 64, generator=g)
            loss = (net(x) - x[:, :1]).pow(2).mean()
            loss.backward()
            opt.step()  # the inner step: psrv.Worker holds no optimizer of its own
            ps.step(loss=loss, batch_size=len(x))


if __name__ == "__main__":
    main(sys.argv[1:])
