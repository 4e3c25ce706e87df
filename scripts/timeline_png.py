"""Draw a few training steps of one or more Chrome traces (COLLECTIVES_TIMELINE) as one PNG.

    python scripts/timeline_png.py overlap.json no-overlap.json --out docs/timeline.png --steps 3

Each trace is one panel; each rank two rows: what the program did (forward, backward per
layer, waits, optimizer step) and what the runtime did (each call and its phases). The
window is ``--steps`` optimizer steps from the middle of the run, the same width in every
panel, so that the panels compare at a glance.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

COLOURS = {"forward": "#4c72b0", "backward": "#55a868", "optimizer step": "#8172b2", "wait": "#c44e52",
           "check": "#dd8452", "reduce-scatter": "#da8bc3", "all-gather": "#937860", "small": "#ccb974",
           "broadcast": "#64b5cd", "call": "#d0d0d0"}


def colour(name: str) -> str:
    for prefix, value in COLOURS.items():
        if name.startswith(prefix):
            return value
    return COLOURS["call"]


def load(path: Path) -> list[dict]:
    return [e for e in json.loads(path.read_text())["traceEvents"] if e.get("ph") == "X"]


def window(events: list[dict], steps: int) -> tuple[float, float]:
    """From the start of a step in the middle of rank 0's run to the end of ``steps`` steps later."""
    ends = sorted(e["ts"] + e["dur"] for e in events if e["pid"] == 0 and e["name"] == "optimizer step")
    if len(ends) < steps + 1:
        raise SystemExit(f"the trace has {len(ends)} optimizer steps; --steps {steps} needs more")
    first = max(0, len(ends) // 2 - steps // 2 - 1)
    return ends[first], ends[first + steps]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("traces", type=Path, nargs="+", help="trace files, one panel each")
    p.add_argument("--labels", nargs="+", help="a title per trace (default: the file names)")
    p.add_argument("--out", type=Path, required=True, help="the PNG to write")
    p.add_argument("--steps", type=int, default=3, help="optimizer steps to show")
    args = p.parse_args()
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    panels = [load(t) for t in args.traces]
    windows = [window(events, args.steps) for events in panels]
    width = max(end - start for start, end in windows)
    fig, axes = plt.subplots(len(panels), 1, figsize=(13, 2.2 + 1.6 * len(panels)), squeeze=False)
    for ax, events, (start, _), label in zip(axes[:, 0], panels, windows, args.labels or [t.name for t in args.traces]):
        ranks = sorted({e["pid"] for e in events})
        rows = [(r, tid) for r in ranks for tid in (0, 1)]
        for e in sorted(events, key=lambda e: "#" not in e["name"]):   # calls first, their phases over them
            if e["tid"] not in (0, 1) or e["ts"] + e["dur"] < start or e["ts"] > start + width:
                continue
            y = rows.index((e["pid"], e["tid"]))
            nested = e["tid"] == 1 and "#" not in e["name"]   # a phase inside a call: drawn thinner
            height = 0.5 if nested else 0.8
            ax.broken_barh([((e["ts"] - start) / 1e3, e["dur"] / 1e3)], (y - height / 2, height),
                           facecolors=colour(e["name"]), edgecolor="none")
        ax.set_yticks(range(len(rows)), [f"rank {r} {'program' if tid == 0 else 'collectives'}" for r, tid in rows])
        ax.invert_yaxis()
        ax.set_xlim(0, width / 1e3)
        ax.set_title(label, loc="left", fontsize=10)
    axes[-1, 0].set_xlabel("milliseconds")
    legend = [Patch(color=c, label=n) for n, c in COLOURS.items()]
    fig.legend(handles=legend, loc="lower center", ncol=len(legend), fontsize=8, frameon=False)
    fig.tight_layout(rect=(0, 0.06, 1, 1))
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
