"""Chapter 1: which (target, Eagle3 draft, --block-size) combinations vLLM accepts, 0.19 beside 0.20.

Every cell comes from :func:`workbench.blocksize.compatibility_matrix` (the catalog's declarations
run through vLLM's selection rule); nothing is typed by hand. Colours: green = the group keeps the
manager block size, amber = it works by splitting each block into smaller kernel blocks,
red = ``No common block size``.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench import blocksize

VERSIONS = ("0.19", "0.20")  # the two panels: before and after PR #39616
_COLORSCALE = [[0.0, "#d62728"], [0.333, "#d62728"], [0.334, "#ffb000"], [0.666, "#ffb000"],
               [0.667, "#2ca02c"], [1.0, "#2ca02c"]]
_LEGEND = ("rows: target backend · columns: Eagle3 draft backend · cell: kernel block size<br>"
           "green: = manager block size · amber: split into smaller kernel blocks · red ✗: no common block size")


def _cells(m: blocksize.CompatibilityMatrix, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(z, text, hover)`` for block size index ``k``; each ``(T, D)``."""
    kernel = m.kernel_block_size[:, :, k]
    manager = m.manager_block_size[:, :, k]
    z = np.where(kernel == 0, 0, np.where(kernel == manager, 2, 1))
    text = np.where(kernel == 0, "✗", kernel.astype(str))
    hover = np.empty(kernel.shape, dtype=object)
    for i, t in enumerate(m.targets):
        for j, d in enumerate(m.drafts):
            kb, n = int(kernel[i, j]), int(manager[i, j])
            verdict = "no common block size" if kb == 0 else \
                f"kernel block {kb}" + ("" if kb == n else f" (each block splits into {n // kb})")
            given = f"--block-size {n}" if m.block_sizes[k] is not None else f"no --block-size ({t} picks {n})"
            hover[i, j] = f"vLLM {m.vllm_version}<br>target {t}<br>draft {d}<br>{given}: {verdict}"
    return z, text, hover


def _matrices(targets, drafts, block_sizes) -> list[blocksize.CompatibilityMatrix]:
    """One matrix per version over the same axes: by default the backends present in both versions
    (MLA targets, standard drafts; TURBOQUANT, new in 0.20, is left out so the panels line up)."""
    cats = [blocksize.catalog(v) for v in VERSIONS]
    both = [n for n in sorted(cats[-1]) if all(n in c for c in cats)]
    if targets is None:
        targets = [n for n in both if cats[-1][n].kind == "mla"]
    if drafts is None:
        drafts = [n for n in both if cats[-1][n].kind == "full"]
    return [blocksize.compatibility_matrix(targets, drafts, block_sizes, v) for v in VERSIONS]


def _figure(mats: Sequence[blocksize.CompatibilityMatrix], k: int, title: str) -> go.Figure:
    first = mats[0]
    fig = make_subplots(rows=1, cols=len(mats), shared_yaxes=True, horizontal_spacing=0.04,
                        subplot_titles=[f"vLLM {m.vllm_version}" + (" (before PR #39616)" if m.vllm_version == "0.19"
                                                                    else " (after)") for m in mats])
    for c, m in enumerate(mats, start=1):
        z, text, hover = _cells(m, k)
        fig.add_trace(go.Heatmap(
            z=z, x=list(m.drafts), y=list(m.targets), text=text, texttemplate="%{text}",
            customdata=hover, hovertemplate="%{customdata}<extra></extra>", colorscale=_COLORSCALE,
            zmin=0, zmax=2, showscale=False, xgap=2, ygap=2, name=f"vLLM {m.vllm_version}", textfont={"size": 9},
        ), row=1, col=c)
    fig.update_xaxes(tickangle=50, tickfont={"size": 9})
    fig.update_yaxes(row=1, col=1, autorange="reversed", tickfont={"size": 9})
    fig.update_yaxes(autorange="reversed")
    fig.update_layout(
        title={"text": f"{title}<br><sup>{_LEGEND}</sup>", "font": {"size": 13}, "y": 0.97, "x": 0.01},
        width=760, height=560, template="plotly_white", margin={"t": 125, "b": 140, "l": 150, "r": 10},
        font={"size": 11},
    )
    return fig


def _label(block_size: int | None) -> str:
    return "no --block-size" if block_size is None else f"--block-size {block_size}"


def blocksize_heatmap(block_size: int | None = blocksize.DEFAULT_BLOCK_SIZE, targets: Sequence[str] | None = None,
                      drafts: Sequence[str] | None = None) -> go.Figure:
    """MLA targets x Eagle3 draft backends at one ``--block-size``, vLLM 0.19 beside 0.20.

    Each cell shows the kernel block size vLLM selects for the shared KV-cache group, or ✗.
    ``block_size=None``: no ``--block-size`` given (each target's backend picks the manager block size).
    """
    mats = _matrices(targets, drafts, (block_size,))
    return _figure(mats, 0, f"Target x Eagle3 draft, {_label(block_size)}: kernel block size")


def blocksize_explorer(block_sizes: Sequence[int | None] = blocksize.DEFAULT_MATRIX_BLOCK_SIZES,
                       targets: Sequence[str] | None = None, drafts: Sequence[str] | None = None,
                       initial: int | None = blocksize.DEFAULT_BLOCK_SIZE) -> go.Figure:
    """The heatmap for every block size in ``block_sizes``, switched by a dropdown (works in a static page).

    All cells are computed here; the dropdown only swaps precomputed data in the browser.
    """
    mats = _matrices(targets, drafts, block_sizes)
    sizes = mats[0].block_sizes
    if initial not in sizes:
        raise ValueError(f"initial={initial} is not one of block_sizes={sizes}")
    k0 = sizes.index(initial)
    fig = _figure(mats, k0, "Target x Eagle3 draft x --block-size (choose the block size)")
    buttons = []
    for k, n in enumerate(sizes):
        cells = [_cells(m, k) for m in mats]
        buttons.append(dict(
            label=_label(n), method="restyle",
            args=[{"z": [c[0] for c in cells], "text": [c[1] for c in cells], "customdata": [c[2] for c in cells]},
                  list(range(len(mats)))],
        ))
    fig.update_layout(updatemenus=[dict(buttons=buttons, active=k0, direction="down", x=1.0, xanchor="right",
                                        y=1.33, yanchor="top", showactive=True, font={"size": 11})])
    return fig


def blocksize_widget():
    """An ipywidgets explorer for JupyterLab: pick target, draft, block size and version; see the report.

    The site cannot run it (no kernel); it shows :func:`blocksize_explorer` instead.
    """
    import ipywidgets as widgets

    names = blocksize.catalog("0.20")
    targets = sorted(names, key=lambda n: (names[n].kind != "mla", n))
    drafts = sorted(n for n, b in names.items() if b.kind == "full")
    w_target = widgets.Dropdown(options=targets, value="ROCM_AITER_MLA", description="target")
    w_draft = widgets.Dropdown(options=drafts, value="ROCM_ATTN", description="draft")
    w_block = widgets.BoundedIntText(value=blocksize.DEFAULT_BLOCK_SIZE, min=1, max=4096, description="--block-size")
    w_version = widgets.ToggleButtons(options=list(VERSIONS), value="0.20", description="vLLM")
    out = widgets.Output()

    def update(_=None):
        out.clear_output()
        with out:
            try:
                print(blocksize.check_spec_decode(w_target.value, w_draft.value, w_block.value, w_version.value))
            except ValueError as exc:
                print(f"error: {exc}")

    for w in (w_target, w_draft, w_block, w_version):
        w.observe(update, names="value")
    update()
    return widgets.VBox([widgets.HBox([w_target, w_draft]), widgets.HBox([w_block, w_version]), out])
