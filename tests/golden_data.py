"""Golden fixtures: small compressed datasets, one per format and codec, committed under
``tests/golden/`` with the SHA-256 of every leaf their inflated form must have. Later versions of
obsdelta must still inflate them to exactly these bytes. Those of format 2 are ``tests/golden/*``;
each later format's are in ``tests/golden/v<N>/`` (one per format, for the codecs of
:data:`NEW_CODECS`).

Write the current format's (only when the stored format changes on purpose, with a new format
version; the fixtures of earlier formats stay as they are)::

    python -m tests.golden_data
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from pathlib import Path

import numpy as np
from tensordict import TensorDict, TensorDictBase

from obsdelta_cli import compress, inflate
from obsdelta_cli.formats import detect, key_str
from obsdelta_cli.formats.leaf import as_rows, is_data
from obsdelta_cli.manifest import FORMAT_VERSION

from .writers import WRITERS

GOLDEN = Path(__file__).parent / "golden"
FORMATS = ["ted-memmap", "ted-pt", "torchrl-rb", "d4rl-hdf5", "robomimic-hdf5", "ted-hdf5"]
CODECS = {"exact": None, "fp16": None, "bf16": None, "fp32": None, "q16": 1e-3, "q8": 1e-2}
#: Codecs of the fixtures of formats after 2: the lossless one and a delta codec.
NEW_CODECS = ("exact", "fp16")


def version_dir(version: int) -> Path:
    """Where the fixtures of format ``version`` are."""
    return GOLDEN if version == 2 else GOLDEN / f"v{version}"


def leaf_hashes(path: Path) -> dict[str, str]:
    """SHA-256 of every array leaf of a dataset, read through obsdelta's own adapters."""
    fmt = detect(path)
    source = fmt.open(path)
    try:
        out = {}
        for key, leaf in source.leaves.items():
            if is_data(leaf):
                rows = as_rows(leaf, source.batch_dims)
                data = np.ascontiguousarray(rows[0 : rows.shape[0]])
                out[key_str(key)] = hashlib.sha256(data.reshape(-1).view(np.uint8)).hexdigest()
        return out
    finally:
        fmt.close(source)


def sample() -> TensorDictBase:
    """96 rows of the Hopper rollout around an episode end, in float32 and float64."""
    hopper = TensorDict.load_memmap(Path(__file__).parents[1] / "sample_data/hopper_ted").clone()
    end = int(hopper["next", "done"].reshape(-1).nonzero()[0])
    td = hopper[max(0, end - 60) : max(0, end - 60) + 96].clone()
    return td


def main() -> None:
    """Write the fixtures of the current format (see the module)."""
    target = version_dir(FORMAT_VERSION)
    if target == GOLDEN:
        raise SystemExit("format 2 fixtures are kept as they were made")
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    expected: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for fmt in FORMATS:
            src = WRITERS[fmt](sample(), Path(tmp) / fmt)
            original = leaf_hashes(src)
            for codec in NEW_CODECS:
                name = f"{fmt}-{codec}{src.suffix}"
                compress(src, target / name, codec=codec, max_abs_error=CODECS[codec])
                back = Path(tmp) / f"back-{name}"
                inflate(target / name, back)
                inflated = leaf_hashes(back)
                if codec == "exact":
                    assert inflated == original, name
                expected[name] = {"codec": codec, "format": fmt, "inflated": inflated}
    (target / "expected.json").write_text(json.dumps(expected, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
