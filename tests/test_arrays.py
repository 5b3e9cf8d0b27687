"""Arrays and dtypes of the core, and the commands that need no torch importing none."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from obsdelta_cli.arrays import (
    DTYPES,
    bfloat16,
    bits_dtype,
    dtype_name,
    dtype_of,
    from_torch,
    is_float,
    numpy_dtype,
    sorted_distinct,
    to_torch,
    torch_dtype,
)
from obsdelta_cli.manifest import DTYPES as MANIFEST_DTYPES

SAMPLES = Path(__file__).parents[1] / "sample_data"


def test_every_dtype_the_metadata_names_is_one_torch_names_alike() -> None:
    assert set(DTYPES) == set(MANIFEST_DTYPES)
    for name, dtype in DTYPES.items():
        assert dtype_of(name) == dtype and dtype_name(dtype) == name
        assert torch_dtype(dtype) == getattr(torch, name)
        assert numpy_dtype(getattr(torch, name)) == dtype
        assert dtype.itemsize == getattr(torch, name).itemsize
    assert is_float(bfloat16()) and is_float(np.dtype(np.float16)) and not is_float(np.dtype(bool))
    assert bits_dtype(np.dtype(np.float64)) == np.int64 and bits_dtype(bfloat16()) == np.int16


@pytest.mark.parametrize("name", sorted(DTYPES))
def test_tensors_and_arrays_share_memory_and_bits(name: str) -> None:
    t = (torch.arange(-6, 6) * 0.75).to(getattr(torch, name))
    a = from_torch(t)
    assert a.dtype == dtype_of(name)
    assert a.view(np.uint8).tobytes() == t.view(torch.uint8).numpy().tobytes()
    back = to_torch(a)
    assert back.dtype == t.dtype and back.data_ptr() == t.data_ptr()
    a[0] = a[1]  # one memory: the tensor sees it
    assert torch.equal(t[0], t[1])


def test_bfloat16_values_round_as_torch_rounds() -> None:
    """Bit for bit but NaN's payload (the casts that write files are torch's own)."""
    x = torch.randn(10_000, generator=torch.Generator().manual_seed(0)) * 1e3
    x[:3] = torch.tensor([float("nan"), float("inf"), -0.0])
    ours = x.numpy().astype(bfloat16())
    assert np.isnan(ours[0])
    theirs = x.bfloat16().view(torch.int16).numpy()
    assert ours[1:].view(np.int16).tobytes() == theirs[1:].tobytes()


def _imports(argv: list[str], cwd: Path) -> set[str]:
    """The packages an ``obsdelta`` command imports modules of (``python -X importtime``)."""
    done = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "obsdelta_cli", *argv],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {
        line.rsplit("|", 1)[1].strip().split(".")[0]
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }


@pytest.mark.parametrize(
    "sample", ["hopper_ted", "hopper_rb", "hopper_d4rl.hdf5", "hopper_robomimic.hdf5"]
)
def test_commands_on_hdf5_and_memmap_inputs_never_import_torch(sample: str, tmp_path: Path) -> None:
    """``import torch`` takes longer than compressing hundreds of MB: a command on an HDF5 file
    or a memmap folder, packed or not, leaves it (and tensordict) out; and ``ml_dtypes``, whose
    import registers dozens of types with numpy, where no leaf is bfloat16."""
    src, small, packed = SAMPLES / sample, tmp_path / "small", tmp_path / "packed.h5"
    if src.suffix:
        small = small.with_suffix(src.suffix)
    runs = [
        ["compress", str(src), "-o", str(small), "-q"],
        ["verify", str(small)],
        ["report", str(small)],
        ["inflate", str(small), "-o", str(tmp_path / ("back" + src.suffix)), "-q"],
        ["compress", str(src), "-o", str(packed), "--pack", "-q"],
        ["verify", str(packed)],
        ["inflate", str(packed), "-o", str(tmp_path / ("unpacked" + src.suffix)), "-q"],
    ]
    for argv in runs:
        imported = _imports(argv, tmp_path)
        assert {"h5py", "obsdelta_cli"} <= imported  # the check sees the command's imports
        assert not {"torch", "tensordict", "ml_dtypes"} & imported, argv


def test_a_pt_input_imports_torch_where_it_needs_it(tmp_path: Path) -> None:
    out = tmp_path / "small.pt"
    imported = _imports(["compress", str(SAMPLES / "halfcheetah_ted.pt"), "-o", str(out)], tmp_path)
    assert "torch" in imported


@pytest.mark.parametrize("size", [0, 1, 2, 7, 1000])
def test_sorted_distinct_is_np_unique(size: int) -> None:
    values = np.random.default_rng(size).integers(-5, 5, size)
    got = sorted_distinct(values)
    assert got.dtype == values.dtype and got.tolist() == np.unique(values).tolist()


def test_bfloat16_leaves_import_ml_dtypes_where_they_are_met(tmp_path: Path) -> None:
    """``ml_dtypes`` is imported on first use: a fresh process compresses, checks and restores
    a folder of bfloat16 observations bit for bit, and a D4RL file through the bf16 codec."""
    from tensordict import TensorDict

    obs = torch.randn(101, 5, generator=torch.Generator().manual_seed(0)).bfloat16()
    td = TensorDict({"observation": obs[:-1], "next": {"observation": obs[1:]}}, batch_size=[100])
    td.memmap(tmp_path / "in")
    small, back = tmp_path / "small", tmp_path / "back"
    for argv in (
        ["compress", str(tmp_path / "in"), "-o", str(small), "-q"],
        ["verify", str(small)],
        ["inflate", str(small), "-o", str(back), "-q"],
    ):
        assert "ml_dtypes" in _imports(argv, tmp_path), argv
    got = TensorDict.load_memmap(back)
    for key in ("observation", ("next", "observation")):
        assert got[key].dtype == torch.bfloat16
        assert torch.equal(got[key].view(torch.int16), td[key].view(torch.int16))
    lossy = tmp_path / "bf16.hdf5"
    for argv in (
        ["compress", str(SAMPLES / "hopper_d4rl.hdf5"), "-o", str(lossy), "--codec", "bf16"],
        ["verify", str(lossy)],
        ["inflate", str(lossy), "-o", str(tmp_path / "lossy-back.hdf5"), "-q"],
    ):
        assert "ml_dtypes" in _imports(argv, tmp_path), argv
