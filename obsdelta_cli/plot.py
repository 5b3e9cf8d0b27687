"""``obsdelta report --plot FILE.png``: sizes per key and codec, and errors per dimension.

matplotlib is an optional extra (``pip install "obsdelta[plot]"``); without it the command says
so in one line.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from .errors import OutputError, UsageError, size_text
from .report import DatasetResult


def check_plotting(path: Path) -> None:
    """Fail before any work if the plot cannot be drawn or saved."""
    try:
        import matplotlib
    except ImportError:
        raise UsageError("--plot needs matplotlib", hint="pip install 'obsdelta[plot]'") from None
    matplotlib.use("Agg")  # files only: no display needed
    if not path.parent.is_dir():
        raise OutputError("folder for the plot does not exist", file=path.parent, hint="create it")


def plot_report(result: DatasetResult, path: Path) -> None:
    """Draw ``result`` to a PNG: one row per key, sizes on the left, error per dimension right."""
    check_plotting(path)
    import matplotlib.pyplot as plt

    fig = draw_report(result)
    try:
        fig.savefig(path, dpi=100, format="png")
    except OSError as exc:
        raise OutputError(f"cannot write the plot ({exc.strerror})", file=path) from None
    finally:
        plt.close(fig)


def draw_report(result: DatasetResult) -> Any:
    """The figure :func:`plot_report` saves. Sizes are on a log scale, each bar labelled, and
    each key's title names the codec picked: a 2 KB pick beside 200 KB of raw bytes would be
    no bar at all on a linear axis."""
    import matplotlib.pyplot as plt

    keys = result.keys or []
    fig, axes = plt.subplots(
        max(1, len(keys)), 2, figsize=(12, 3.2 * max(1, len(keys))), squeeze=False
    )
    for row, key in zip(axes, keys, strict=False):
        sizes, errors = row
        options = key.candidates or []
        names = ["raw", *[c.codec for c in options]] if options else ["raw", key.codec]
        values = (
            [key.bytes_before, *[c.bytes_after for c in options]]
            if options
            else [
                key.bytes_before,
                key.bytes_after,
            ]
        )
        pick = key.auto_pick or key.codec
        colors = ["#999999", *["#d62728" if n == pick else "#1f77b4" for n in names[1:]]]
        bars = sizes.bar(names, [max(v, 1) for v in values], color=colors)
        sizes.bar_label(bars, labels=[size_text(v) for v in values], fontsize="small")
        sizes.set_yscale("log")
        sizes.set_ylabel("bytes (log scale)")
        picked = next((v for n, v in zip(names, values, strict=True) if n == pick), None)
        shown = f"{pick} ({size_text(picked)})" if picked is not None else pick
        sizes.set_title(
            f"{key.key} ({key.dtype}, {'x'.join(map(str, key.shape))}): size; "
            f"picked, in red: {shown}"
        )
        plotted = False
        for c in options:
            if c.feature_max_abs and max(c.feature_max_abs) > 0:
                errors.plot(
                    range(len(c.feature_max_abs)), c.feature_max_abs, marker=".", label=c.codec
                )
                plotted = True
        if plotted:
            errors.set_yscale("log")
            errors.legend(fontsize="small")
        else:
            errors.text(
                0.5,
                0.5,
                f"max abs error {key.max_abs_error:.3g}",
                ha="center",
                transform=errors.transAxes,
            )
        errors.set_xlabel("dimension (flattened)")
        errors.set_ylabel("max abs error")
        errors.set_title("error per dimension (lossless codecs: 0, not drawn)")
    if not keys:
        axes[0][0].text(0.5, 0.5, result.note or "no keys", ha="center", wrap=True)
    fig.suptitle(f"{result.input} ({result.format})")
    fig.tight_layout()
    return fig
