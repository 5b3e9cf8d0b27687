"""Every registered format is detected from content and has a test writer."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from tensordict import TensorDictBase

from obsdelta_cli.errors import InputError
from obsdelta_cli.formats import FORMATS, detect

from .conftest import SAMPLE
from .writers import OUTPUT_WRITERS, RECOGNISED_WRITERS, WRITERS


def test_every_format_has_a_writer() -> None:
    assert set(WRITERS) | set(OUTPUT_WRITERS) | set(RECOGNISED_WRITERS) == set(FORMATS)


@pytest.mark.parametrize("fmt", list(FORMATS))
def test_detected_from_content_not_name(fmt: str, tmp_path: Path, hopper: TensorDictBase) -> None:
    path = {**WRITERS, **OUTPUT_WRITERS, **RECOGNISED_WRITERS}[fmt](hopper[:400], tmp_path / "data")
    odd = tmp_path / "renamed.h5"  # a misleading name changes nothing
    path.rename(odd)
    assert detect(odd).name == fmt


@pytest.mark.parametrize(
    ("name", "fmt"),
    [
        ("hopper_ted", "ted-memmap"),
        ("halfcheetah_ted.pt", "ted-pt"),
        ("hopper_rb", "torchrl-rb"),
        ("pong_pixels.pt", "ted-pt"),
        ("hopper_d4rl.hdf5", "d4rl-hdf5"),
        ("hopper_robomimic.hdf5", "robomimic-hdf5"),
    ],
)
def test_samples_are_detected(name: str, fmt: str) -> None:
    assert detect(SAMPLE / name).name == fmt


def test_open_is_lazy_and_never_writes_through(tmp_path: Path, hopper: TensorDictBase) -> None:
    path = WRITERS["ted-memmap"](hopper, tmp_path / "data")
    before = (path / "observation.memmap").read_bytes()
    source = detect(path).open(path)
    leaf = source.leaves[("observation",)]
    want = hopper["observation"][10:20].numpy()
    got = leaf.read(10, 20)  # reads rows on demand
    assert got.dtype == want.dtype and np.array_equal(got, want)
    with pytest.raises(OSError):  # opened read-only: a bug writing to the input fails
        leaf.write(0, np.zeros((1, 11), np.float32))
    source.handle["observation"].fill(0)  # nor does writing through the leaf's mapped view
    assert (path / "observation.memmap").read_bytes() == before


def test_unknown_layout(tmp_path: Path) -> None:
    odd = tmp_path / "notes.txt"
    odd.write_text("hello")
    with pytest.raises(InputError) as caught:
        detect(odd)
    assert str(caught.value) == (
        f"{odd}: file is in no layout obsdelta reads; it reads {', '.join(FORMATS)} "
        "(README: Formats)"
    )


def test_a_folder_of_datasets_is_told_to_give_them_as_inputs(tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    (folder / "notes.txt").write_text("hello")
    names = ["a_ted", "b_d4rl.hdf5", "c.pt", "d_rb", "e_robomimic.hdf5"]
    for name, sample in zip(
        names,
        [
            "hopper_ted",
            "hopper_d4rl.hdf5",
            "halfcheetah_ted.pt",
            "hopper_rb",
            "hopper_robomimic.hdf5",
        ],
        strict=True,
    ):
        (folder / name).symlink_to(SAMPLE / sample)
    with pytest.raises(InputError) as caught:
        detect(folder)
    assert str(caught.value) == (
        f"{folder}: directory holds datasets (a_ted, b_d4rl.hdf5, c.pt and 2 more) but is not "
        "one; give each dataset as an input: a command takes several, and -o FOLDER/ gets one "
        "output per input"
    )
    for name in names:
        (folder / name).unlink()
    with pytest.raises(InputError, match="directory is in no layout obsdelta reads"):
        detect(folder)  # a folder of anything else is told what obsdelta reads
