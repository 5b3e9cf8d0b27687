"""What every registered codec and layout must do, as functions. The suites parametrised over
the registries (``CODECS``, ``FORMATS``) call them, and a codec or layout registered from test
code alone runs through the same checks (``tests/test_extension.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tensordict import TensorDict, TensorDictBase

from obsdelta_cli import compress, inflate, open_dataset, rebuild, verify
from obsdelta_cli.arrays import from_torch, to_torch
from obsdelta_cli.codecs import codec_from_config, make_codec
from obsdelta_cli.errors import UsageError
from obsdelta_cli.stats import bit_equal_rows

#: The bound a codec that needs one is checked at.
BOUND = 1e-3


def needs_bound(codec_id: str) -> bool:
    """Whether codec ``codec_id`` is made only with an error bound."""
    try:
        make_codec(codec_id)
    except UsageError:
        return True
    return False


def check_codec_config(codec_id: str) -> None:
    """The codec describes itself and is rebuilt from its stored config."""
    codec = make_codec(codec_id, BOUND if needs_bound(codec_id) else None)
    assert codec.summary
    again = codec_from_config(codec.get_config())
    assert type(again) is type(codec) and again.get_config() == codec.get_config()


def check_codec_rebuild(codec_id: str) -> None:
    """Compress compares the successor rows themselves where a codec says its rebuild is
    them (``rebuilds_as_successor``), and inflate writes ``decode``'s rows: the same, bit for
    bit; the rebuild compress compares (``rebuild.decode(view=True)``) is ``decode``'s."""
    codec = make_codec(codec_id, BOUND if needs_bound(codec_id) else None)
    rng = np.random.default_rng(7)
    obs = rng.standard_normal((40, 5)).astype(np.float32)
    successor = np.concatenate([obs[1:], obs[-1:]])
    nxt = successor + np.float32(1e-4) * rng.standard_normal((40, 5)).astype(np.float32)
    stored = codec.encode(obs, nxt, successor)
    dtype = np.dtype(np.float32)
    decoded = codec.decode(obs, stored, successor, dtype).view(np.int32)
    view = rebuild.decode(codec, obs, stored, successor, dtype, view=True)
    np.testing.assert_array_equal(view.view(np.int32), decoded)
    if codec.rebuilds_as_successor:
        np.testing.assert_array_equal(successor.view(np.int32), decoded)


def check_codec_round_trip(codec_id: str, tmp: Path) -> None:
    """``compress --codec codec_id`` of a rollout with episode boundaries, then ``verify`` and
    ``inflate``: a lossless codec gives every value back bit for bit; any other stays within
    the bound and within the error it reports."""
    rng = np.random.default_rng(3)
    frames = np.cumsum(rng.standard_normal((301, 7)), axis=0).astype(np.float32)
    obs, nxt = frames[:-1].copy(), frames[1:].copy()
    nxt[99], nxt[199] = frames[5], frames[17]  # two episodes end: their last next is elsewhere
    td = TensorDict(
        {"observation": to_torch(obs), "next": {"observation": to_torch(nxt)}},
        batch_size=[len(obs)],
    )
    src, small, back = tmp / "in.pt", tmp / "small.pt", tmp / "back.pt"
    torch.save(td, src)
    bound = BOUND if needs_bound(codec_id) else None
    result = compress(src, small, codec=codec_id, max_abs_error=bound, keys=["observation"])
    assert [k.codec for k in result.keys] == [codec_id]
    verify(small)
    inflate(small, back)
    got = from_torch(torch.load(back, weights_only=False)["next", "observation"])
    codec = make_codec(codec_id, bound)
    if codec.lossless:
        assert bool(bit_equal_rows(got, nxt).all())
        assert result.keys[0].max_abs_error == 0
    else:
        err = float(np.abs(got.astype(np.float64) - nxt.astype(np.float64)).max())
        reported = result.keys[0].max_abs_error
        assert reported is not None and err <= reported <= (bound if bound else np.inf)


def everything(path: Path) -> TensorDictBase:
    """Every row of ``path`` through :func:`open_dataset`."""
    data = open_dataset(path)
    try:
        return data[torch.arange(len(data))]
    finally:
        data.close()


def check_slices(path: Path) -> None:
    """Consecutive rows read as a slice (one read a leaf, its blocks checked from the values
    served) equal the same rows read by index; each read through a new reader, so each checks
    its blocks itself."""
    rows = len(open_dataset(path))
    spans = [slice(None), slice(1, rows - 1), slice(rows // 3, rows // 3 + 5), slice(-2, None)]
    for span in [*spans, slice(None, None, 3)]:
        got = open_dataset(path)[span]
        bits_equal(got, open_dataset(path)[torch.arange(rows)[span]])
    whole = open_dataset(path)[:1]
    for span in (slice(5, 5), slice(rows, None)):
        empty = open_dataset(path)[span]
        assert empty.batch_size == (0,) and set(empty.keys(True)) == set(whole.keys(True))


def bits_equal(a: TensorDictBase, b: TensorDictBase) -> None:
    """``a`` and ``b`` hold the same keys, dtypes, shapes and bits."""
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for key in a.keys(True, True):
        x, y = a[key], b[key]
        assert x.dtype == y.dtype and x.shape == y.shape, key
        assert (
            torch.equal(x.view(torch.uint8), y.view(torch.uint8))
            if x.is_floating_point()
            else torch.equal(x, y)
        ), key


def check_layout(src: Path, tmp: Path, codec: str) -> None:
    """A dataset in a registered layout: ``compress`` finds its pairs and stores them,
    ``verify`` passes, training reads of the compressed file give what ``inflate`` writes
    (and, lossless, the original), and the stored delta stays hidden."""
    small, back = tmp / f"small{src.suffix}", tmp / f"back{src.suffix}"
    result = compress(src, small, codec=codec)
    assert result.keys and all(k.codec == codec for k in result.keys)
    verify(small)
    inflate(small, back)
    compressed, inflated = everything(small), everything(back)
    bits_equal(compressed, inflated)  # rebuilt on the fly exactly as inflate does
    assert ("next", "delta") not in compressed.keys(True)
    if make_codec(codec).lossless:
        bits_equal(compressed, everything(src))
        bits_equal(inflated, everything(src))
    assert len(compressed) == len(open_dataset(small))
    check_slices(small)
