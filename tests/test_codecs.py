"""Every codec class is registered, rebuilds from its stored config, and keeps its promises."""

from __future__ import annotations

import importlib
import inspect
import pkgutil

import pytest
import torch

import obsdelta_cli.codecs as codecs_pkg
from obsdelta_cli.codecs import CODECS, Codec, codec_from_config, get_codec
from obsdelta_cli.errors import InputError, UsageError


def _codec_classes() -> set[type[Codec]]:
    found = set()
    for info in pkgutil.iter_modules(codecs_pkg.__path__):
        module = importlib.import_module(f"{codecs_pkg.__name__}.{info.name}")
        for _, obj in inspect.getmembers(module, inspect.isclass):
            if issubclass(obj, Codec) and not inspect.isabstract(obj) and "id" in obj.__dict__:
                found.add(obj)
    return found


def test_every_codec_is_registered() -> None:
    assert _codec_classes() == set(CODECS.values())
    assert all(CODECS[c.id] is c for c in _codec_classes())


@pytest.mark.parametrize("codec_id", list(CODECS))
def test_config_round_trip(codec_id: str) -> None:
    codec = get_codec(codec_id)
    assert codec.summary
    again = codec_from_config(codec.get_config())
    assert type(again) is type(codec) and again.get_config() == codec.get_config()


@pytest.mark.parametrize("codec_id", list(CODECS))
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_identical_rows_are_exact(codec_id: str, dtype: torch.dtype) -> None:
    codec = get_codec(codec_id)
    obs = torch.linspace(-100, 100, 64, dtype=torch.float64).to(dtype).reshape(8, 8)
    stored = codec.encode(obs, obs.clone())
    assert stored.dtype == codec.stored_dtype(dtype)
    assert torch.equal(codec.decode(obs, stored, dtype), obs)


def test_unknown_ids_list_the_known_ones() -> None:
    with pytest.raises(UsageError, match="fp16"):
        get_codec("zstd-9000")
    with pytest.raises(InputError, match="upgrade obsdelta"):
        codec_from_config({"id": "from-the-future"})
