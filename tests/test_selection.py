"""Which observation pairs are encoded, and why one named with ``--key`` is refused."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from tensordict import NonTensorData, TensorDict

from obsdelta_cli import compress
from obsdelta_cli.errors import ObsdeltaError


def test_a_named_key_holding_no_array_is_refused_saying_what_it_holds(tmp_path: Path) -> None:
    obs = torch.randn(9, 3, generator=torch.Generator().manual_seed(0))
    td = TensorDict(
        {
            "observation": obs[:-1],
            "info": NonTensorData("hopper-v5", batch_size=[8]),
            "next": {"observation": obs[1:], "info": NonTensorData("hopper-v5", batch_size=[8])},
        },
        [8],
    )
    td.memmap(tmp_path / "run")
    with pytest.raises(ObsdeltaError) as caught:
        compress(tmp_path / "run", tmp_path / "out", keys=["info"])
    text = str(caught.value)
    assert "is not an array of numbers: info holds non-tensor data" in text, text
    assert not (tmp_path / "out").exists()
