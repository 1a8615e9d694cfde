"""Writing report figures: one helper every report module shares (so none imports another for it)."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, out_dir: Path, name: str) -> str:
    """Write one figure as a PNG beside the report and free it; returns the file name for the report."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(out_dir / name, dpi=90)
    plt.close(fig)
    return name
