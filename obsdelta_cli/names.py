"""Names the command line offers as choices, as plain strings, so that ``--help`` and
``--version`` start without importing torch or h5py.

They mirror the codec registry (:data:`obsdelta_cli.codecs.CODECS`), the HDF5 filters
(:data:`obsdelta_cli.formats.hdf5.H5_COMPRESSIONS`) and the default chunk size of the commands;
``tests/test_help.py`` checks that they agree.
"""

from __future__ import annotations

#: Codec id -> one-line summary, in registry order.
CODECS: dict[str, str] = {
    "exact": "lossless: stores only rows where next_obs[t] is not obs[t+1] (episode ends)",
    "fp16": "float16 delta (TorchRL's default): 11 significant bits, |delta| <= 65504",
    "bf16": "bfloat16 delta: 8 significant bits, float32's range",
    "fp32": "float32 delta: for float64 sources or deltas beyond float16's range",
    "q16": "int16 multiples of 1.9*E (needs --max-abs-error E): 2 bytes per value",
    "q8": "int8 multiples of 1.9*E (needs --max-abs-error E): 1 byte per value",
}
#: ``--codec auto``: per key, the smallest codec within the bound (lossless without one).
AUTO = "auto"
DEFAULT_CODEC = AUTO
#: ``--h5-compression`` choices.
H5_COMPRESSIONS = ("gzip", "lzf", "zstd", "blosc", "none")
#: ``--chunk-mb`` default, in MiB.
DEFAULT_CHUNK_MB: float = 1
#: What ``compress --pack`` adds to an input's name in a folder of outputs, where the input is
#: not already named as an HDF5 file: a packed file is one, whatever it holds.
PACKED_SUFFIX = ".h5"
