"""The manifest: a typed round trip, and one clear error for every malformed field."""

from __future__ import annotations

import contextlib
import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from obsdelta_cli import compress, inflate, report, verify
from obsdelta_cli.errors import FormatVersionError, InputError
from obsdelta_cli.manifest import FORMAT_VERSION, content_hash, parse

from .conftest import SAMPLE, Cli


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """A real manifest: the Hopper sample compressed with a delta codec (exception rows too)."""
    out = tmp_path_factory.mktemp("m") / "small"
    compress(SAMPLE / "hopper_ted", out, codec="fp16", max_abs_error=1e-4)
    return json.loads((out / "obsdelta.json").read_text())


def test_round_trip(stored: dict[str, Any]) -> None:
    manifest = parse(stored)
    assert manifest.version == FORMAT_VERSION and manifest.container == "ted-memmap"
    (key,) = manifest.keys
    assert key.codec == {"id": "fp16"} and not key.lossless and key.bound == 1e-4
    assert key.exception_rows > 0 and key.arrays is not None
    assert set(key.hashes) == {"next", "rebuilt", "stored", "index", "rows"}
    assert parse(manifest.to_json()) == manifest
    assert manifest.to_json() == stored


def _set(
    data: dict[str, Any], path: tuple[Any, ...], value: Any, *, seal: bool = True
) -> dict[str, Any]:
    """``data`` with the field at ``path`` replaced (or deleted); ``seal`` recomputes the
    manifest's own hash, as an editor that knows the format would, so the field checks run."""
    out = copy.deepcopy(data)
    node = out
    for part in path[:-1]:
        node = node[part]
    if value is _DELETE:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    if seal and path != ("manifest_hash",):
        out["manifest_hash"] = content_hash({k: v for k, v in out.items() if k != "manifest_hash"})
    return out


_DELETE = object()
# (field path, bad value, words the message must hold)
MALFORMED = [
    (("obsdelta_format",), "2", "obsdelta_format has the wrong type"),
    (("obsdelta_format",), 0, "obsdelta_format is out of range"),
    (("obsdelta_format",), True, "obsdelta_format has the wrong type"),
    (("batch_dims",), 0, "batch_dims is out of range"),
    (("batch_dims",), 10**9, "batch_dims is out of range"),
    (("time_dim",), 3, "time_dim is out of range"),
    (("time_dim",), _DELETE, "time_dim is missing"),
    (("valid_rows",), -1, "valid_rows is out of range"),
    (("leaf_order",), {"a": 1}, "leaf_order has the wrong type"),
    (("leaf_order", 0), ["..", "x"], "outside the dataset"),
    (("leaf_order", 0), [], "is not a key"),
    (("hash", "algorithm"), "md5", "hash.algorithm is unknown"),
    (("checksums", "action"), "not hex!", "is not a hex digest"),
    (("keys",), "x", "keys has the wrong type"),
    (("keys", 0), [], "keys[0] is not a JSON object"),
    (("keys", 0, "codec"), {}, "keys[0].codec.id is missing"),
    (("keys", 0, "rows"), 2**60, "keys[0].rows is out of range"),
    (("keys", 0, "exact_rows"), 10**7, "keys[0].exact_rows exceeds rows"),
    (("keys", 0, "source_dtype"), "complex128", "unknown dtype"),
    (("keys", 0, "stored_dtype"), None, "delta_key and stored_dtype disagree"),
    (("keys", 0, "max_abs_error"), float("nan"), "is not a finite number"),
    (("keys", 0, "max_abs_error"), -1.0, "is not a finite number"),
    (("keys", 0, "arrays"), {"index": "../../etc/passwd", "rows": "k0.rows"}, "unsafe array"),
    (("keys", 0, "lossless"), "yes", "keys[0].lossless has the wrong type"),
    (("keys", 0, "obs_key"), ["a/b"], "outside the dataset"),
    (("keys", 0, "hashes", "next"), 5, "is not a hex digest"),
]


@pytest.mark.parametrize(("path", "value", "says"), MALFORMED, ids=[str(m[0]) for m in MALFORMED])
def test_malformed_field_is_one_clear_error(
    stored: dict[str, Any], path: tuple[Any, ...], value: Any, says: str
) -> None:
    with pytest.raises(InputError, match="damaged or was edited") as info:
        parse(_set(stored, path, value), file="f")
    assert says in info.value.message


@pytest.mark.parametrize(
    ("path", "value"),
    [(("keys", 0, "rows"), 2999), (("keys", 0, "max_abs_error"), 0.5), (("valid_rows",), 7)],
)
def test_edited_manifest_is_caught_by_its_hash(
    stored: dict[str, Any], path: tuple[Any, ...], value: Any
) -> None:
    """A change that still parses (a bit flip in a figure) does not match the manifest hash."""
    with pytest.raises(InputError, match="manifest_hash does not match"):
        parse(_set(stored, path, value, seal=False), file="f")


def test_newer_version_asks_for_an_upgrade(stored: dict[str, Any]) -> None:
    with pytest.raises(FormatVersionError, match="upgrade obsdelta"):
        parse({**stored, "obsdelta_format": FORMAT_VERSION + 1})


@pytest.mark.parametrize(
    ("path", "value"),
    [
        (("keys", 0, "obs_key"), ["no_such_leaf"]),
        (("keys", 0, "delta_key"), ["next", "reward"]),  # a leaf of another dtype
        (("keys", 0, "source_dtype"), "float64"),
        (("keys", 0, "exception_rows"), 2999),  # more rows than the arrays hold
        (("valid_rows",), 5),  # exception rows past the valid rows
    ],
)
def test_manifest_that_disagrees_with_the_data_is_refused(
    cli: Cli, tmp_path: Path, stored: dict[str, Any], path: tuple[Any, ...], value: Any
) -> None:
    compress(SAMPLE / "hopper_ted", tmp_path / "s", codec="fp16", max_abs_error=1e-4)
    (tmp_path / "s" / "obsdelta.json").write_text(json.dumps(_set(stored, path, value)))
    for command in (["verify"], ["report"], ["inflate", "-o", str(tmp_path / "back")]):
        result = cli(command[0], tmp_path / "s", *command[1:], code=1)
        assert result.stderr.startswith("obsdelta: error:") and "Traceback" not in result.stderr
        assert len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "back").exists()


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_mutated_manifest_never_crashes(stored: dict[str, Any], data: st.DataObject) -> None:
    """Any field replaced by any JSON value: a manifest, or InputError; nothing else."""
    paths: list[tuple[Any, ...]] = []

    def walk(node: Any, path: tuple[Any, ...]) -> None:
        paths.append(path)
        if isinstance(node, dict | list):
            for k, v in node.items() if isinstance(node, dict) else enumerate(node):
                walk(v, (*path, k))

    walk(stored, ())
    path = data.draw(st.sampled_from([p for p in paths if p]))
    value = data.draw(
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
            lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner),
            max_leaves=5,
        )
    )
    with contextlib.suppress(InputError):
        parse(_set(stored, path, value), file="f")


def test_format_1_files_still_read(tmp_path: Path) -> None:
    golden = Path(__file__).parent / "golden"
    manifest = parse(json.loads((golden / "ted-memmap-exact" / "obsdelta.json").read_text()))
    assert manifest.version == 1 and manifest.hash_algorithm == "crc32"
    assert manifest.keys[0].lossless and manifest.keys[0].hashes["rebuilt"]
    verify(golden / "ted-memmap-exact")
    inflate(golden / "ted-memmap-exact", tmp_path / "back")
    assert report(golden / "ted-memmap-exact").compressed
