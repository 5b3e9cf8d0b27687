"""The command line reaches the library through one frozen dataclass per command, each field
a parameter of the library function it runs; no untyped mapping crosses between them."""

from __future__ import annotations

import dataclasses
import inspect
import pickle
import typing
from pathlib import Path

import pytest

import obsdelta_cli
from obsdelta_cli import batch, cli, options
from obsdelta_cli.batch import Job

OPTIONS = typing.get_args(options.Options)


@pytest.mark.parametrize("kind", OPTIONS, ids=lambda k: k.command)
def test_each_field_is_a_parameter_of_the_library_function(kind: type) -> None:
    function = getattr(obsdelta_cli, kind.command)
    parameters = inspect.signature(function).parameters
    for field in dataclasses.fields(kind):
        assert field.name in parameters, (kind.command, field.name)
        default = parameters[field.name].default
        assert field.default == default or (field.default is None and default is None), field.name
    assert dataclasses.is_dataclass(kind) and kind.__dataclass_params__.frozen  # type: ignore[attr-defined]


def test_no_untyped_mapping_crosses_from_the_command_line_to_the_library() -> None:
    for module in (cli, batch, options):
        source = inspect.getsource(module)
        assert "dict[str, Any]" not in source and "**job" not in source, module.__name__
    hints = typing.get_type_hints(Job)
    assert hints["options"] == options.Options


def test_a_job_travels_to_a_worker_whole(tmp_path: Path) -> None:
    job = Job(tmp_path / "in", tmp_path / "out", options.CompressOptions(codec="fp16", keys=("a",)))
    again = pickle.loads(pickle.dumps(job))
    assert again == job and again.command == "compress"
