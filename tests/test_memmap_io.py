"""Memmap folders and replay-buffer dumps, as the installed tensordict/TorchRL write them, go
through compress and inflate with plain file I/O: every file comes back byte for byte, the
compressed output still opens with ``TensorDict.load_memmap``, and nothing is ever unpickled."""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from tensordict import NonTensorData, TensorDict

from obsdelta_cli import compress, inflate, report, verify

from .writers import write_rb

T = 24


def rollout(non_tensor: object = "hopper-v5") -> TensorDict:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(T + 1, 5, generator=g)
    pix = torch.randint(0, 255, (T + 1, 2, 3), generator=g, dtype=torch.uint8)
    done = torch.zeros(T, 1, dtype=torch.bool)
    done[-1] = True
    return TensorDict(
        {
            "observation": obs[:-1],
            "agent": TensorDict({"pixels": pix[:-1]}, [T]),
            "odd key:1": obs[:-1, :2].clone(),  # a key tensordict percent-encodes on disk
            "action": torch.randn(T, 2, generator=g),
            "info": NonTensorData(non_tensor, batch_size=[T]),
            "next": TensorDict(
                {
                    "observation": obs[1:],
                    "agent": TensorDict({"pixels": pix[1:]}, [T]),
                    "odd key:1": obs[1:, :2].clone(),
                    "reward": torch.randn(T, 1, generator=g),
                    "done": done,
                },
                [T],
            ),
        },
        [T],
    )


def write(kind: str, td: TensorDict, path: Path) -> Path:
    if kind == "memmap":
        td.memmap(path)
        (path / "env_metadata.json").write_text('{"env": "Hopper-v5"}')
        return path
    del td["info"]  # a replay buffer stores tensors only
    return write_rb(td, path)


def files(root: Path) -> dict[str, bytes]:
    out = {}
    for folder, _dirs, names in os.walk(root):
        for name in names:
            p = Path(folder) / name
            out[str(p.relative_to(root))] = p.read_bytes()
    return out


@pytest.mark.parametrize("codec", ["exact", "fp16"])
@pytest.mark.parametrize("kind", ["memmap", "rb"])
def test_round_trip_gives_every_file_back(tmp_path: Path, kind: str, codec: str) -> None:
    src = write(kind, rollout(), tmp_path / "in")
    compress(src, tmp_path / "small", codec=codec)
    inflate(tmp_path / "small", tmp_path / "back")
    before, after = files(src), files(tmp_path / "back")
    assert sorted(after) == sorted(before)
    # fp16 is lossy: only the rebuilt float next observations may differ, and only in value.
    lossy = {"storage/next/observation.memmap", "storage/next/odd%20key%3A1.memmap"}
    lossy |= {k.removeprefix("storage/") for k in lossy}
    changed = [k for k in before if before[k] != after[k]]
    assert changed == [] if codec == "exact" else set(changed) <= lossy
    assert all(len(before[k]) == len(after[k]) for k in before)
    assert any(k.endswith("%3A1.memmap") for k in before)  # the encoded name was exercised


@pytest.mark.parametrize("kind", ["memmap", "rb"])
def test_compressed_output_opens_with_load_memmap(tmp_path: Path, kind: str) -> None:
    src = write(kind, rollout(), tmp_path / "in")
    compress(src, tmp_path / "small", codec="fp16")
    storage = "" if kind == "memmap" else "storage"
    td = TensorDict.load_memmap(tmp_path / "small" / storage)
    original = TensorDict.load_memmap(src / storage)
    assert ("next", "observation") not in td.keys(True)
    delta = td["next", "delta", "observation"]
    assert delta.dtype == torch.float16 and delta.shape == original["observation"].shape
    assert torch.equal(td["observation"], original["observation"])
    if kind == "memmap":
        assert td["info"] == "hopper-v5"


class Payload:
    """Unpickling it creates a marker file."""

    marker = ""

    def __reduce__(self) -> tuple[object, tuple[str, str]]:
        return (open, (self.marker, "w"))


def test_a_hostile_pickle_is_never_loaded(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    payload = Payload()
    payload.marker = str(marker)
    src = tmp_path / "in"
    rollout(non_tensor=payload).memmap(src)
    assert any(p.suffix in (".pickle", ".pkl") for p in src.rglob("*")), sorted(src.rglob("*"))
    assert not marker.exists()
    report(src)
    compress(src, tmp_path / "small", codec="exact")
    verify(tmp_path / "small")
    report(tmp_path / "small")
    inflate(tmp_path / "small", tmp_path / "back")
    assert not marker.exists()
    before, after = files(src), files(tmp_path / "back")
    assert before == after
    json.loads((tmp_path / "small" / "meta.json").read_text())
    # The folder really is hostile: tensordict's own loader runs the payload.
    with contextlib.suppress(Exception):
        TensorDict.load_memmap(src)
    assert marker.exists()


def test_a_leaf_fed_through_mapped_windows_gives_the_bytes_reads_give(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from obsdelta_cli.checksum import Hasher
    from obsdelta_cli.formats import leaf

    monkeypatch.setattr(leaf, "_WINDOW", mmap_page := 4096)  # several windows, one partial
    values = np.arange(5000, dtype=np.float32).reshape(1000, 5)
    path = tmp_path / "x.memmap"
    path.write_bytes(values.tobytes())
    f = leaf.FileLeaf(path, np.dtype(np.float32), (1000, 5), writable=True)
    fed, read = Hasher(), Hasher()
    assert f.feed(fed.update)
    read.update(f.read(0, 1000))
    assert fed.hex == read.hex and len(path.read_bytes()) > 4 * mmap_page
    f.write(10, np.zeros((3, 5), np.float32))  # written, and handed to the kernel's write-back
    assert np.array_equal(f.read(10, 13), np.zeros((3, 5), np.float32))
    os.truncate(path, 4000)  # shorter than the leaf: nothing is mapped past the end
    assert f.feed(fed.update) is False
    with pytest.raises(OSError, match="unexpected end of file"):
        f.read(0, 1000)
    f.close()
