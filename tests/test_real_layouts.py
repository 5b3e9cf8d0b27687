"""obsdelta on datasets laid out as the real ones ship: D4RL v2 (with metadata/ and infos/),
float64 replay, no next_observations, shuffled rows, robomimic with 200 demos, TorchRL offline
caches, Minari and TED-HDF5, all from real Hopper-v5 rollouts."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from obsdelta_cli import compress, inflate, open_dataset, report, verify
from obsdelta_cli.formats.pack_io import HEAVY_INDEX

from . import realistic as R
from .conformance import everything
from .conftest import Cli, marked_h5py_only
from .test_hdf5 import describe
from .test_pack import h5_objects

D4RL_ROWS = 20_000
DATASET_ID = "hopper-medium-v2"
#: Layouts of :func:`real` that h5py writes and obsdelta reads through h5py alone.
H5PY = frozenset({"d4rl", "replay64", "no-next", "shuffled", "robomimic"})
MINARI_ID = "hopper/random-v0"


@pytest.fixture(scope="session")
def real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every layout, written once per session (about 15 s, 60 MB)."""
    pytest.importorskip("gymnasium")
    base = tmp_path_factory.mktemp("real")
    t0 = time.time()
    r = R.hopper_rollout(D4RL_ROWS)
    out: dict[str, Path] = {}
    out["d4rl"] = R.write_d4rl_v2(r, base / "hopper-medium-v2.hdf5")
    out["replay64"] = R.write_d4rl_v2(r, base / "hopper-medium-replay-v2.hdf5", dtype=np.float64)
    out["no-next"] = R.write_d4rl_v2(r, base / "antmaze-like.hdf5", next_observations=False)
    perm = np.random.default_rng(3).permutation(D4RL_ROWS)
    out["shuffled"] = R.write_d4rl_v2(r, base / "shuffled.hdf5", permutation=perm)
    out["robomimic"] = R.write_robomimic_real(base / "robomimic_lift.hdf5", demos=200, image=16)
    out["d4rl-cache"] = R.write_torchrl_d4rl_cache(out["d4rl"], base / "torchrl_d4rl", DATASET_ID)
    out["ted-hdf5"] = base / "ted.h5"
    R.ted_from_rollout(r).to_h5(out["ted-hdf5"], compression="gzip")
    sizes = {k: _size(p) for k, p in out.items()}
    print(f"real layouts written in {time.time() - t0:.1f} s: {sizes}")
    return out


@pytest.fixture(scope="session")
def minari_real(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Minari dataset written by minari's DataCollector, and TorchRL's cache of it."""
    pytest.importorskip("minari")
    base = tmp_path_factory.mktemp("minari")
    t0 = time.time()
    out = {"minari": R.write_minari_dataset(5000, base / "datasets", MINARI_ID)}
    out["minari-cache"] = R.write_torchrl_minari_cache(
        base / "datasets", base / "torchrl", MINARI_ID
    )
    print(f"minari layouts written in {time.time() - t0:.1f} s")
    return out


def _size(path: Path) -> int:
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _h5_objects(path: Path, prefix: str) -> dict[str, Any]:
    """Properties and bytes of every object under ``prefix``."""
    props = {k: v for k, v in describe(path).items() if k == prefix or k.startswith(prefix + "/")}
    with h5py.File(path, "r") as f:
        for name, p in props.items():
            if p["kind"] == "dataset":
                p["bytes"] = np.asarray(f[name][()]).tobytes()
    return props


# 1 ---------------------------------------------------------------------------------------------


def test_d4rl_v2_rows_and_metadata_kept(real: dict[str, Path], tmp_path: Path) -> None:
    src = real["d4rl"]
    data = open_dataset(src)
    assert len(data) == D4RL_ROWS  # not 3 (last_fc/weight) nor 256 (fc0/weight)
    data.close()
    small, back = tmp_path / "small.hdf5", tmp_path / "back.hdf5"
    compress(src, small)
    inflate(small, back)
    for prefix in ("metadata", "infos"):
        want = _h5_objects(src, prefix)
        got = _h5_objects(small, prefix)
        # obsdelta's group is /metadata/obsdelta in a D4RL file with metadata: its only addition.
        ours = {k for k in got if k == "metadata/obsdelta" or k.startswith("metadata/obsdelta/")}
        assert bool(ours) == (prefix == "metadata")
        assert {k: v for k, v in got.items() if k not in ours} == want, prefix
        assert _h5_objects(back, prefix) == want, prefix
    assert describe(back) == describe(src)


# 2 ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "layout", marked_h5py_only(["d4rl", "replay64", "robomimic", "d4rl-cache", "ted-hdf5"], H5PY)
)
def test_default_is_lossless(real: dict[str, Path], layout: str, tmp_path: Path, cli: Cli) -> None:
    src = real[layout]
    suffix = src.suffix
    small, back = tmp_path / f"small{suffix}", tmp_path / f"back{suffix}"
    line = json.loads(cli("compress", src, "-o", small, "--json").stdout)
    assert line["keys"], line
    for key in line["keys"]:
        assert key["lossless"] is True, key
        assert key["max_abs_error"] == 0, key
    cli("inflate", small, "-o", back)
    a, b = everything(src), everything(back)
    assert set(a.keys(True, True)) == set(b.keys(True, True))
    for k in a.keys(True, True):
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k
    if small.is_file():
        assert _h5_bytes(back) == _h5_bytes(src)
    for key in json.loads(cli("report", small, "--json").stdout)["keys"]:
        assert key["lossless"] is True, key


@pytest.mark.parametrize("pack", [False, True], ids=["plain", "packed"])
def test_robomimic_cameras_of_no_pixels(tmp_path: Path, cli: Cli, pack: bool) -> None:
    # Camera keys of 0x0 pixels (a rendering switched off) beside the low-dim observations:
    # nothing to compress there, so those pairs stay as they are; the others are compressed.
    pytest.importorskip("gymnasium")
    src = R.write_robomimic_real(tmp_path / "lift.hdf5", demos=12, image=0)
    small, back = tmp_path / ("small.h5" if pack else "small.hdf5"), tmp_path / "back.hdf5"
    line = json.loads(cli("compress", src, "-o", small, "--json", *["--pack"][:pack]).stdout)
    names = {key["key"].rpartition("/")[2] for key in line["keys"]}
    assert names and not any("image" in n for n in names), names
    cli("verify", small)
    cli("inflate", small, "-o", back)
    assert _h5_bytes(back) == _h5_bytes(src)
    with h5py.File(src, "r") as a, h5py.File(back, "r") as b:
        shapes = {n: (o.shape, o.dtype) for n, o in _datasets(a)}
        assert shapes == {n: (o.shape, o.dtype) for n, o in _datasets(b)}
        assert any(0 in shape for shape, _ in shapes.values())


def _datasets(f: h5py.File) -> list[tuple[str, h5py.Dataset]]:
    found: list[tuple[str, h5py.Dataset]] = []
    f.visititems(lambda n, o: found.append((n, o)) if isinstance(o, h5py.Dataset) else None)
    return found


def _h5_bytes(path: Path) -> dict[str, bytes]:
    out: dict[str, bytes] = {}
    with h5py.File(path, "r") as f:
        f.visititems(
            lambda n, o: (
                out.__setitem__(n, np.asarray(o[()]).tobytes())
                if isinstance(o, h5py.Dataset)
                else None
            )
        )
    return out


def test_default_compresses_atari_frames(pong: TensorDict, tmp_path: Path, cli: Cli) -> None:
    pong.memmap(tmp_path / "pong")
    line = json.loads(cli("compress", tmp_path / "pong", "-o", tmp_path / "s", "--json").stdout)
    (key,) = line["keys"]
    assert key["dtype"] == "uint8" and key["codec"] not in ("none", None)
    assert key["lossless"] is True and key["bytes_after"] < key["bytes_before"] / 4


def test_lossy_only_when_named(real: dict[str, Path], tmp_path: Path, cli: Cli) -> None:
    small = tmp_path / "s.hdf5"
    line = json.loads(
        cli("compress", real["d4rl"], "-o", small, "--codec", "fp16", "--json").stdout
    )
    (key,) = line["keys"]
    assert key["lossless"] is False
    assert key["codec"] == "fp16" and 0 < key["max_abs_error"] < 1e-2
    assert "max_abs_error_bound" in key
    bounded = json.loads(
        cli(
            "compress",
            real["d4rl"],
            "-o",
            tmp_path / "q.hdf5",
            "--codec",
            "q8",
            "--max-abs-error",
            "1e-2",
            "--json",
        ).stdout
    )["keys"][0]
    assert bounded["lossless"] is False and bounded["max_abs_error_bound"] == 1e-2
    assert bounded["max_abs_error"] <= 1e-2


# 3 ---------------------------------------------------------------------------------------------


def _leaves(folder: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(folder)): p.read_bytes()
        for p in sorted(folder.rglob("*"))
        if p.is_file() and not p.name.startswith("obsdelta") and "obsdelta.arrays" not in p.parts
    }


@pytest.mark.parametrize("cache", ["d4rl-cache", "minari-cache"])
def test_torchrl_cache_only_observations_and_shifted_twins_rewritten(
    request: pytest.FixtureRequest, cache: str, tmp_path: Path
) -> None:
    """The lossless default removes the next observations and every other next leaf that is
    a shifted copy (TorchRL's D4RL cache keeps ``("next", "reward")`` and ``("next", "info",
    *)`` so), and gives every byte back; flags (bool) stay as they are."""
    layouts = request.getfixturevalue("real" if cache == "d4rl-cache" else "minari_real")
    src = layouts[cache]
    root_small, root_back = tmp_path / "small", tmp_path / "back"
    # TorchRL keeps a cache at ROOT/<dataset id>, and Minari ids hold a "/".
    rel = Path(DATASET_ID if cache == "d4rl-cache" else MINARI_ID)
    assert src.parts[-len(rel.parts) :] == rel.parts
    small, back = root_small / rel, root_back / rel
    small.parent.mkdir(parents=True)
    back.parent.mkdir(parents=True)
    before = _leaves(src)
    result = compress(src, small)
    removed = ["next/observation"]
    if cache == "d4rl-cache":
        removed += [
            "next/reward",
            *(f"next/info/{k}" for k in ("action_log_probs", "qpos", "qvel")),
        ]
        assert result.bytes_before / result.bytes_after >= 1.7
    assert [k.key for k in result.keys] == removed, [k.key for k in result.keys]
    assert all(k.codec == "exact" and k.lossless for k in result.keys)
    inflate(small, back)
    stored, restored = _leaves(small), _leaves(back)
    for name, raw in before.items():
        if any(name.startswith(k) for k in removed):
            continue
        # rewards, done/terminated/truncated, info/*, their next twins, meta.json and
        # env_metadata.json: byte for byte in the compressed and the inflated cache.
        if not name.endswith("meta.json") or name == "env_metadata.json":
            assert stored.get(name) == raw, name
        assert restored.get(name) == raw, name
    assert restored == before
    want = TensorDict.load_memmap(src)
    # TorchRL reopens the inflated cache as it left it.
    td = _reopen(cache, root_back)
    assert (td == want).all()
    # It also reopens the compressed cache (exact stores no per-row leaf, so the next
    # observation is absent there, and every other leaf is the original).
    td = _reopen(cache, root_small)
    gone = {tuple(k.split("/")) for k in removed}
    assert set(td.keys(True, True)) == set(want.keys(True, True)) - gone
    assert ("next", "delta") not in td.keys(True)
    for key in td.keys(True, True):
        assert (td[key] == want[key]).all(), key


def test_a_lossy_codec_touches_only_observations(real: dict[str, Path], tmp_path: Path) -> None:
    result = compress(real["d4rl-cache"], tmp_path / "small", codec="fp16")
    assert [k.key for k in result.keys] == ["next/observation"]


def _reopen(cache: str, root: Path) -> TensorDict:
    from torchrl.data.datasets import D4RLExperienceReplay, MinariExperienceReplay

    if cache == "d4rl-cache":
        rb = D4RLExperienceReplay(DATASET_ID, batch_size=8, root=root, download=False)
    else:
        rb = MinariExperienceReplay(MINARI_ID, batch_size=8, root=root, download=False)
        assert rb.metadata["observation_space"] is not None
    assert len(rb) > 0
    rb.sample()
    return rb.storage._storage


# 4 ---------------------------------------------------------------------------------------------


def test_robomimic_exact_near_the_floor(real: dict[str, Path], tmp_path: Path) -> None:
    src = real["robomimic"]
    floor = R.write_robomimic_floor(src, tmp_path / "floor.hdf5").stat().st_size
    small = tmp_path / "small.hdf5"
    result = compress(src, small, codec="exact")
    got = small.stat().st_size
    print(f"robomimic: input {src.stat().st_size}, floor {floor}, exact {got}")
    assert got <= floor * 1.02, (got, floor)
    predicted = report(src, codec="exact").bytes_after
    assert abs(predicted - got) <= 0.02 * got, (predicted, got)
    assert result.bytes_after == got


def test_robomimic_demos_in_numeric_order(real: dict[str, Path]) -> None:
    src = real["robomimic"]
    order = R.demo_order(src)
    assert order.index("demo_2") < order.index("demo_10")
    rows = everything(src)
    with h5py.File(src, "r") as f:
        want = np.concatenate([f[f"data/{d}/obs/robot0_eef_pos"][()] for d in order])
        lengths = [f[f"data/{d}"].attrs["num_samples"] for d in order]
    got = rows["robot0_eef_pos"].numpy()
    assert got.shape == want.shape and np.array_equal(got, want)
    start10 = int(np.sum(lengths[:10]))
    end9 = start10 - 1
    with h5py.File(src, "r") as f:
        assert np.array_equal(got[start10], f["data/demo_10/obs/robot0_eef_pos"][0])
        assert np.array_equal(got[end9], f["data/demo_9/obs/robot0_eef_pos"][-1])


# 5 ---------------------------------------------------------------------------------------------

CODECS: list[tuple[str | None, float | None]] = [
    (None, None),
    ("exact", None),
    ("fp16", None),
    ("bf16", None),
    ("q8", 1e-2),
]


@pytest.mark.parametrize(("codec", "bound"), CODECS, ids=lambda v: str(v))
@pytest.mark.parametrize(
    "layout",
    marked_h5py_only(["d4rl", "replay64", "shuffled", "robomimic", "d4rl-cache", "ted-hdf5"], H5PY),
)
def test_never_larger(
    real: dict[str, Path], layout: str, codec: str | None, bound: float | None, tmp_path: Path
) -> None:
    src = real[layout]
    out = tmp_path / f"out{src.suffix}"
    kwargs: dict[str, Any] = {"max_abs_error": bound}
    if codec:
        kwargs["codec"] = codec
    try:
        compress(src, out, **kwargs)
    except Exception as exc:  # a refusal of the data is fine; a larger output is not
        from obsdelta_cli import ObsdeltaError
        from obsdelta_cli.errors import OutputError

        assert isinstance(exc, ObsdeltaError) and not isinstance(exc, OutputError), exc
        assert not out.exists()
        return
    assert _size(out) <= _size(src) + 64 * 1024, (_size(out), _size(src))


# 6 ---------------------------------------------------------------------------------------------


def test_ted_hdf5_fp16_readable_by_torchrl(real: dict[str, Path], tmp_path: Path) -> None:
    from tensordict import PersistentTensorDict
    from torchrl.envs.transforms import NextObservationDelta

    src = real["ted-hdf5"]
    small = tmp_path / "small.h5"
    result = compress(src, small, codec="fp16")
    (key,) = result.keys
    opened = PersistentTensorDict.from_h5(small, batch_size=[D4RL_ROWS])
    local = opened.to_tensordict()
    opened.close()
    assert ("next", "delta", "observation") in local.keys(True, True)
    rebuilt = NextObservationDelta(in_keys=["observation"])(local.clone())
    original = PersistentTensorDict.from_h5(src, batch_size=[D4RL_ROWS]).to_tensordict()
    err = rebuilt["next", "observation"].double() - original["next", "observation"].double()
    ok = err.abs().amax(-1) <= key.max_abs_error
    # Exception rows (if any) have a zero delta: only obsdelta rebuilds those.
    assert int((~ok).sum()) <= key.exception_rows


# 7 ---------------------------------------------------------------------------------------------


def test_minari_transitions(minari_real: dict[str, Path]) -> None:
    src = minari_real["minari"]
    rows = everything(src)
    with h5py.File(src, "r") as f:
        episodes = sorted(f, key=lambda e: int(e.split("_")[1]))
        obs = [f[e]["observations"][()] for e in episodes]
        steps = sum(len(o) - 1 for o in obs)
    assert rows.shape[0] == steps
    want_obs = np.concatenate([o[:-1] for o in obs])
    want_next = np.concatenate([o[1:] for o in obs])
    assert np.array_equal(rows["observation"].numpy(), want_obs)
    assert np.array_equal(rows["next", "observation"].numpy(), want_next)


# 8 ---------------------------------------------------------------------------------------------


def test_no_next_observations_is_explained(real: dict[str, Path], tmp_path: Path, cli: Cli) -> None:
    src = real["no-next"]
    result = cli("compress", src, "-o", tmp_path / "o.hdf5", code=1)
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, lines
    line = lines[0].lower()
    assert "nothing to compress" in line and "next" in line, line
    assert "--codec" not in line and "codec" not in line, line
    assert not (tmp_path / "o.hdf5").exists()


@pytest.mark.parametrize("name", ["no-next", "minari"])
def test_pack_takes_what_compress_cannot(
    request: pytest.FixtureRequest, name: str, tmp_path: Path
) -> None:
    """A D4RL AntMaze-style file and a Minari file written by minari store each observation
    once: ``--pack`` filters them into a smaller file that h5py, ``open_dataset`` and
    ``inflate`` read as the original, and ``report --pack`` predicts its size."""
    layouts = request.getfixturevalue("minari_real" if name == "minari" else "real")
    src = layouts[name]
    packed = tmp_path / "p.h5"
    done = compress(src, packed, pack=True)
    assert done.keys == [] and packed.stat().st_size < src.stat().st_size
    predicted = report(src, pack=True).bytes_after
    assert abs(predicted - packed.stat().st_size) <= 0.05 * packed.stat().st_size
    verify(packed)
    with h5py.File(src, "r") as a, h5py.File(packed, "r") as b:
        plain: list[str] = []
        a.visititems(lambda n, o: plain.append(n) if isinstance(o, h5py.Dataset) else None)
        assert plain and all(np.array_equal(a[n][()], b[n][()]) for n in plain)
        # Minari's small chunked datasets carry version-1 B-trees of 2 KB or more: none is
        # copied with it.
        index = {n: h5py.h5o.get_info(b[n].id).meta_size.obj.index_size for n in plain}
        assert max(index.values()) <= HEAVY_INDEX, max(index.items(), key=lambda kv: kv[1])
    a_all, b_all = everything(src), everything(packed)
    assert sorted(a_all.keys(True, True), key=str) == sorted(b_all.keys(True, True), key=str)
    assert all(torch.equal(a_all[k], b_all[k]) for k in a_all.keys(True, True))
    inflate(packed, tmp_path / "back.hdf5")
    assert h5_objects(tmp_path / "back.hdf5") == h5_objects(src)


# 9 ---------------------------------------------------------------------------------------------


def qlearning_dataset(path: Path, terminate_on_end: bool = False) -> dict[str, np.ndarray]:
    """d4rl.qlearning_dataset, as d4rl writes it, on a file."""
    with h5py.File(path, "r") as f:
        d = {k: f[k][()] for k in ("observations", "actions", "rewards", "terminals", "timeouts")}
        has_next = "next_observations" in f
        if has_next:
            d["next_observations"] = f["next_observations"][()]
    n = d["rewards"].shape[0]
    obs_, next_obs_, action_, reward_, done_ = [], [], [], [], []
    episode_step = 0
    for i in range(n - 1):
        obs = d["observations"][i].astype(np.float32)
        new_obs = (d["next_observations"][i] if has_next else d["observations"][i + 1]).astype(
            np.float32
        )
        final_timestep = bool(d["timeouts"][i])
        if (not terminate_on_end) and final_timestep:
            episode_step = 0
            continue
        if bool(d["terminals"][i]) or final_timestep:
            episode_step = 0
        obs_.append(obs)
        next_obs_.append(new_obs)
        action_.append(d["actions"][i].astype(np.float32))
        reward_.append(d["rewards"][i].astype(np.float32))
        done_.append(bool(d["terminals"][i]))
        episode_step += 1
    return {
        "observations": np.array(obs_),
        "actions": np.array(action_),
        "next_observations": np.array(next_obs_),
        "rewards": np.array(reward_),
        "terminals": np.array(done_),
    }


@pytest.mark.parametrize("layout", ["d4rl", "replay64", "shuffled"])
def test_d4rl_qlearning_dataset_round_trip(
    real: dict[str, Path], layout: str, tmp_path: Path
) -> None:
    src = real[layout]
    small, back = tmp_path / "s.hdf5", tmp_path / "b.hdf5"
    compress(src, small, codec="exact")
    inflate(small, back)
    want, got = qlearning_dataset(src), qlearning_dataset(back)
    for k in want:
        assert want[k].dtype == got[k].dtype and np.array_equal(want[k], got[k]), k


@pytest.mark.parametrize("load_next_obs", [True, False])
def test_robomimic_sequence_dataset_round_trip(
    real: dict[str, Path], tmp_path: Path, load_next_obs: bool
) -> None:
    from robomimic.utils import obs_utils
    from robomimic.utils.dataset import SequenceDataset

    obs_utils.initialize_obs_utils_with_obs_specs(
        {"obs": {"low_dim": list(R.LOW_DIM), "rgb": list(R.CAMERAS)}}
    )
    src = real["robomimic"]
    small, back = tmp_path / "s.hdf5", tmp_path / "b.hdf5"
    compress(src, small, codec="exact")
    inflate(small, back)

    def load(path: Path) -> list[dict]:
        ds = SequenceDataset(
            hdf5_path=str(path),
            obs_keys=[*R.LOW_DIM, *R.CAMERAS],
            dataset_keys=("actions", "rewards", "dones"),
            seq_length=10,
            hdf5_cache_mode="low_dim",
            hdf5_use_swmr=False,
            load_next_obs=load_next_obs,
        )
        items = [ds[i] for i in range(0, len(ds), 37)]
        if ds.hdf5_file is not None:
            ds.hdf5_file.close()
        return items

    want, got = load(src), load(back)
    assert len(want) == len(got)

    def flat(item: dict, prefix: str = "") -> dict[str, np.ndarray]:
        out = {}
        for k, v in item.items():
            if isinstance(v, dict):
                out.update(flat(v, f"{prefix}{k}/"))
            else:
                out[f"{prefix}{k}"] = np.asarray(v)
        return out

    for a, b in zip(want, got, strict=True):
        fa, fb = flat(a), flat(b)
        assert fa.keys() == fb.keys()
        assert any(k.startswith("next_obs/") for k in fa) == load_next_obs
        for k in fa:
            assert fa[k].dtype == fb[k].dtype and np.array_equal(fa[k], fb[k]), k
    if not load_next_obs:
        # SequenceDataset(load_next_obs=False) never touches next_obs/: it reads the compressed
        # file directly.
        assert len(load(small)) == len(want)


# slow: full-size robomimic images --------------------------------------------------------------


@pytest.mark.slow
def test_robomimic_full_size_images_exact_near_the_floor(tmp_path: Path) -> None:
    src = R.write_robomimic_real(tmp_path / "lift_image.hdf5", demos=200, image=84)
    floor = R.write_robomimic_floor(src, tmp_path / "floor.hdf5").stat().st_size
    small = tmp_path / "small.hdf5"
    compress(src, small, codec="exact")
    assert small.stat().st_size <= floor * 1.02
    inflate(small, tmp_path / "back.hdf5")
    assert _h5_bytes(tmp_path / "back.hdf5") == _h5_bytes(src)
    shutil.rmtree(tmp_path, ignore_errors=True)


@pytest.mark.parametrize("codec", ["exact", "fp16"])
@pytest.mark.parametrize("pack", [False, True], ids=["compressed", "packed"])
def test_torchrl_d4rl_class_builds_the_same_cache(
    real: dict[str, Path], tmp_path: Path, pack: bool, codec: str
) -> None:
    """TorchRL's D4RLExperienceReplay takes every root object of a D4RL file for data and
    sets ``metadata`` apart: obsdelta's group is ``/metadata/obsdelta`` there, its arrays
    numbers (tensordict sizes no group of only opaque data), so TorchRL builds from a
    compressed or packed file (hdf5plugin imported, for the packed filters) the cache it
    builds from the original, leaf for leaf and bit for bit. TorchRL never reads
    ``next_observations``: even ``fp16`` gives the same cache."""
    pytest.importorskip("hdf5plugin")
    import hdf5plugin  # noqa: F401 - the packed datasets' filter, for TorchRL's reads

    d4rl = tmp_path / "hopper.hdf5"
    compress(real["d4rl"], d4rl, pack=pack, codec=codec)
    with h5py.File(d4rl, "r") as f:
        assert "obsdelta" not in f and "obsdelta" in f["metadata"]
        found: list[str] = []
        f.visit(lambda name: found.append(name) if name.startswith("metadata/obsdelta") else None)
        assert found and not any(h5py.check_opaque_dtype(f[n].dtype) for n in found if _ds(f, n))
    built = R.write_torchrl_d4rl_cache(d4rl, tmp_path / "d4rl-cache", DATASET_ID)
    _same_cache(built, real["d4rl-cache"])
    back = tmp_path / "back.hdf5"
    inflate(d4rl, back)
    assert describe(back) == describe(real["d4rl"])  # /metadata as it was, no obsdelta in it
    if codec == "exact":
        assert _h5_bytes(back) == _h5_bytes(real["d4rl"])


def _same_cache(built: Path, original: Path) -> None:
    """Two TorchRL caches (TED memmap folders) hold the same leaves, bit for bit."""
    got, want = TensorDict.load_memmap(built), TensorDict.load_memmap(original)
    assert got.batch_size == want.batch_size
    assert set(got.keys(True, True)) == set(want.keys(True, True))
    for key in want.keys(True, True):
        assert torch.equal(got[key], want[key]), key


def _ds(f: h5py.File, name: str) -> bool:
    return isinstance(f[name], h5py.Dataset)


def test_torchrl_minari_class_builds_the_same_cache_from_a_packed_file(
    minari_real: dict[str, Path], tmp_path: Path
) -> None:
    """TorchRL's MinariExperienceReplay (``load_from_local_minari=True``) takes every root
    object of ``main_data.hdf5`` for an episode: a packed Minari file holds nothing else (its
    manifest is a root attribute, each dataset's creation properties are in it), so TorchRL
    builds from it, with hdf5plugin imported, the cache it builds from the original, leaf for
    leaf and bit for bit."""
    pytest.importorskip("hdf5plugin")
    import hdf5plugin  # noqa: F401 - the packed datasets' filter, for TorchRL's reads

    src = minari_real["minari"]
    root = src.parents[3]  # MINARI_DATASETS_PATH/hopper/random-v0/data/main_data.hdf5
    datasets = tmp_path / "datasets"
    shutil.copytree(root, datasets)
    main = datasets / src.relative_to(root)
    main.unlink()
    compress(src, main, pack=True)
    with h5py.File(main, "r") as f:
        assert all(name.startswith("episode_") for name in f), sorted(f)[-3:]
    built = R.write_torchrl_minari_cache(datasets, tmp_path / "minari-cache", MINARI_ID)
    _same_cache(built, minari_real["minari-cache"])
