"""The package's layers, top to bottom: a module imports only from its own layer or lower ones.

``tests/test_layers.py`` walks every import of the package (lazy ones inside functions too)
and fails on an import from a higher layer or on any import circle. Each module is named once;
``name.*`` stands for every module of package ``name`` (the package's ``__init__`` too).

>>> layer_of("formats.hdf5"), layer_of("commands.pack"), layer_of("")
('containers', 'commands', 'base')
"""

from __future__ import annotations

import fnmatch

#: (layer, what it holds, its modules relative to ``obsdelta_cli``; ``""`` is the package
#: itself), from the top down.
LAYERS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("entry", "the console script", ("__main__",)),
    (
        "cli",
        "the command line: its options, typed per command, the job runner, tables, plots",
        ("cli", "batch", "options", "render", "plot"),
    ),
    ("commands", "compress, inflate, report, verify as library functions", ("commands.*",)),
    (
        "access",
        "a dataset as a whole: opened and checked, read for training, output rules",
        ("dataset", "storage", "inputs", "outputs"),
    ),
    (
        "pack",
        "the layout registry and the packed HDF5 file: its reader and its writers",
        (
            "formats",
            "formats.packed",
            "formats.pack_leaves",
            "formats.packing",
            "formats.pack_io",
            "formats.pack_writer",
            "formats.pack_unpack",
            "formats.pack_flat",
            "formats.pack_pt",
            "formats.pack_columns",
            "formats.pack_props",
        ),
    ),
    (
        "layouts",
        "one adapter per dataset layout, on the containers below",
        (
            "formats.d4rl",
            "formats.minari",
            "formats.robomimic",
            "formats.ted",
            "formats.ted_hdf5",
            "formats.ted_memmap",
            "formats.ted_pt",
            "formats.torchrl_checkpoint",
            "formats.torchrl_rb",
        ),
    ),
    (
        "containers",
        "storage families: HDF5 files, memmap folders, .pt zip archives",
        (
            "formats.hdf5",
            "formats.hdf5_*",
            "formats.memmap_tree",
            "formats.zip_skeleton",
            "formats.apart",
        ),
    ),
    (
        "core",
        "rows, codecs, the rebuild rule, judging, hashing, HDF5 filters, freed memory",
        (
            "arrays",
            "blocks",
            "formats.chunk_cache",
            "checksum",
            "codecs.*",
            "filters",
            "heap",
            "rebuild",
            "selection",
            "stats",
            "stream",
        ),
    ),
    (
        "interfaces",
        "what layouts, containers and the core share: sources, pairs, plans, leaves",
        ("formats.base", "formats.leaf", "formats.folder_safety"),
    ),
    (
        "io",
        "the manifest, atomic outputs, signals, progress, disk tuning",
        ("manifest", "atomic", "interrupts", "progress", "identity", "formats.direct"),
    ),
    (
        "base",
        "errors, result records, option names, the version, this table",
        ("", "errors", "names", "report", "layers"),
    ),
)

#: Layer names, top first.
ORDER: tuple[str, ...] = tuple(name for name, _, _ in LAYERS)


def layer_of(module: str) -> str:
    """The layer of ``module`` (relative to ``obsdelta_cli``); :class:`LookupError` if it has
    none or several."""
    found = [
        name
        for name, _, patterns in LAYERS
        if any(matches(module, pattern) for pattern in patterns)
    ]
    if len(found) != 1:
        raise LookupError(f"module {module!r} is in {len(found)} layers: {found}")
    return found[0]


def matches(module: str, pattern: str) -> bool:
    """Whether ``pattern`` of :data:`LAYERS` names ``module``."""
    if pattern.endswith(".*") and module == pattern[:-2]:  # the package's __init__
        return True
    return fnmatch.fnmatchcase(module, pattern) if "*" in pattern else module == pattern


def rank(module: str) -> int:
    """How low ``module``'s layer is: 0 for the top; an import may go to the same rank or a
    higher one."""
    return ORDER.index(layer_of(module))
