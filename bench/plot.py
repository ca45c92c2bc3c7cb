#!/usr/bin/env python3
"""conveyor-bench --plot: a run's figures as one picture, drawn with matplotlib from the bench's JSON.

usage: plot.py BENCH.json OUT.svg|OUT.png

conveyor-bench runs this script (installed beside it as conveyor-bench-plot.py) with the JSON it
wrote; it can also be run by hand on any JSON that conveyor-bench --json wrote. Three panels:
  - images/s over time, one line per run (Conveyor and each reference, the median round of each),
    so a slow start, a stall or a drifting machine shows; under --workers auto also Conveyor's
    active workers over time (stats().active_workers_history), dashed, on the right axis;
  - the per-batch latency distribution (time between consecutive batches the consumer got), as a
    cumulative distribution per run that delivers batches;
  - the time split of each Conveyor run per image: worker time reading, decoding, transforming
    (resize, flip, layout) and in the engine's other fill work; consumer time issuing copies,
    waiting for a batch, and in the loop's own work; with --gpu-decode, the GPU decode thread's
    time busy and idle, and each decoder's share of the images (also in the rate's legend).
Every figure printed (images/s, ratios, p50 and p99) is the bench's own, read from the JSON; the
script only draws. Text stays text in an SVG (svg.fonttype none), and each line is a group whose
id names it ("rate:RUN", "latency:RUN", "workers:RUN"; GPU decode's bars "gpu:RUN:KEY"), so that a
test can find them.
"""
import json
import sys

import matplotlib
import matplotlib.patches

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

# One colour per run, in table order; Conveyor's first.
RUN_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
               "#7f7f7f"]
# The time split's stages: (key in time_split, label, colour).
WORKER_STAGES = [("read", "read", "#9ecae1"), ("decode", "decode", "#3182bd"),
                 ("transform", "resize, flip, layout", "#fd8d3c"),
                 ("fill_other", "other fill work", "#bdbdbd")]
CONSUMER_STAGES = [("copy_issue", "copy issue", "#74c476"),
                   ("wait", "waiting for a batch", "#de2d26"),
                   ("loop", "the loop's own work", "#d9d9d9")]
# GPU decode's thread (--gpu-decode): its time on chunks and waiting for one (gpu_decode in the JSON).
GPU_STAGES = [("gpu_busy_seconds", "GPU decode: busy", "#6a51a3"),
              ("gpu_idle_seconds", "GPU decode: idle", "#dadaeb")]


def gpu_decode(run):
    """The run's split between the decoders when GPU decode ran in it, else None."""
    g = run.get("gpu_decode") or {}
    return g if g.get("active") else None


def colour(i):
    return RUN_COLOURS[i % len(RUN_COLOURS)]


def rate_series(timeline, window):
    """Images/s in consecutive windows of `window` seconds, as steps (each window's rate at its start
    and at its end); the last window, if shorter than half a window, joins the one before."""
    if len(timeline) < 2 or timeline[-1][0] <= 0:
        return [], []
    t = np.array([p[0] for p in timeline], dtype=float)
    n = np.array([p[1] for p in timeline], dtype=float)
    end = t[-1]
    edges = [0.0]
    while edges[-1] + window < end:
        edges.append(edges[-1] + window)
    if len(edges) > 1 and end - edges[-1] < window / 2:
        edges.pop()
    edges.append(end)
    done = np.interp(edges, t, n)
    xs, ys = [], []
    for k in range(len(edges) - 1):
        rate = (done[k + 1] - done[k]) / (edges[k + 1] - edges[k])
        xs += [edges[k], edges[k + 1]]
        ys += [rate, rate]
    return xs, ys


def workers_series(history, end):
    """The active workers as steps from each change to the next, the last one held to `end`."""
    xs, ys = [], []
    for k, h in enumerate(history):
        until = history[k + 1]["seconds"] if k + 1 < len(history) else max(end, h["seconds"])
        xs += [h["seconds"], until]
        ys += [h["workers"], h["workers"]]
    return xs, ys


def plot_workers(ax, runs):
    """Under --workers auto: each Conveyor run's active workers over time, on a right axis."""
    tuned = [(i, r) for i, r in enumerate(runs) if r.get("active_workers_history")]
    if not tuned:
        return None
    right = ax.twinx()
    top = 1
    handles = []
    for i, r in tuned:
        end = r["timeline"][-1][0] if r["timeline"] else r["seconds"]
        xs, ys = workers_series(r["active_workers_history"], end)
        top = max(top, r["workers"], *ys)
        label = f"{r['name']}: active workers"
        (line,) = right.plot(xs, ys, color=colour(i), linewidth=1.5, linestyle="--", label=label)
        line.set_gid("workers:" + r["name"])
        handles.append(line)
    right.set_ylabel("active workers")
    right.set_ylim(0, top + 0.5)
    right.yaxis.get_major_locator().set_params(integer=True)
    right.legend(handles=handles, title="right axis, dashed", loc="lower right", fontsize=9,
                 title_fontsize=9, frameon=True)
    return right


def plot_rates(ax, runs):
    t_top = max((r["timeline"][-1][0] for r in runs if r["timeline"]), default=0.1)
    window = max(0.25, t_top / 40)
    handles = []
    for i, r in enumerate(runs):
        xs, ys = rate_series(r["timeline"], window)
        label = f"{r['name']}: {r['images_per_s']:.1f} ({r['ratio']:.2f}x)"
        if gpu_decode(r):
            label += f", {gpu_decode(r)['gpu_share']:.0%} decoded on the GPU"
        (line,) = ax.plot(xs, ys, color=colour(i), linewidth=2, label=label)
        line.set_gid("rate:" + r["name"])
        handles.append(line)
    workers = plot_workers(ax, runs)
    ax.set_title(f"Images/s over time (median round of each run; {window:g} s windows)",
                 loc="left", fontweight="bold", fontsize=12)
    ax.set_xlabel("seconds since the run's start")
    ax.set_ylabel("images/s")
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0)
    ax.grid(color="#e5e5e5")
    # With a right axis (active workers, its own legend inside) this one moves past its labels.
    ax.legend(handles=handles, title="run: images/s (Conveyor / run)", loc="upper left",
              bbox_to_anchor=(1.06 if workers else 1.01, 1), fontsize=9, title_fontsize=10,
              frameon=False)


def plot_latency(ax, runs):
    ax.set_title("Per-batch latency (time between batches)", loc="left", fontweight="bold",
                 fontsize=12)
    ax.set_xlabel("ms between consecutive batches")
    ax.set_ylabel("share of batches at most x")
    ax.set_ylim(0, 1.02)
    ax.grid(color="#e5e5e5")
    with_batches = [(i, r) for i, r in enumerate(runs) if r["batch_ms"]]
    if not with_batches:
        ax.text(0.5, 0.5, "no run delivered batches", ha="center", transform=ax.transAxes)
        return
    ms_top = max(float(np.quantile(r["batch_ms"], 0.995)) for _, r in with_batches)
    for i, r in with_batches:
        ms = np.sort(np.array(r["batch_ms"], dtype=float))
        share = np.arange(1, len(ms) + 1) / len(ms)
        label = f"{r['name']}: p50 {r['p50_batch_ms']:.1f} ms, p99 {r['p99_batch_ms']:.1f} ms"
        (line,) = ax.step(ms, share, where="post", color=colour(i), linewidth=1.5, label=label)
        line.set_gid("latency:" + r["name"])
    ax.set_xlim(0, max(ms_top, 1.0))
    ax.legend(loc="lower right", fontsize=8, frameon=False)


def plot_split(ax, runs):
    ax.set_title("Where the time goes, per image (Conveyor runs)", loc="left", fontweight="bold",
                 fontsize=12)
    split = [r for r in runs if r["time_split"] and r["images"] > 0]
    if not split:
        ax.axis("off")
        ax.text(0.5, 0.5, "no Conveyor run on an image source", ha="center",
                transform=ax.transAxes)
        return
    labels, y = [], 0
    for r in split:
        per = 1000.0 / r["images"]  # milliseconds per image
        worker = [r["time_split"].get(key, 0.0) * per for key, _, _ in WORKER_STAGES]
        copy = r["time_split"].get("copy_issue", 0.0) * per
        wait = r["time_split"].get("wait", 0.0) * per
        consumer = [copy, wait, max(0.0, r["seconds"] * per - copy - wait)]
        bars = [(worker, WORKER_STAGES, f"workers ({r['workers']})"),
                (consumer, CONSUMER_STAGES, "consumer")]
        g = gpu_decode(r)
        if g:  # the decode thread's busy and idle time, and each decoder's share of the images
            bars[0] = (worker, WORKER_STAGES, f"workers ({r['workers']}), {1 - g['gpu_share']:.0%}")
            bars.append(([g[key] * per for key, _, _ in GPU_STAGES], GPU_STAGES,
                         f"GPU decode, {g['gpu_share']:.0%}"))
        for values, stages, what in bars:
            left = 0.0
            for v, (key, _, c) in zip(values, stages):
                bar = ax.barh(y, v, left=left, color=c, height=0.7)
                if stages is GPU_STAGES:
                    for patch in bar.patches:
                        patch.set_gid(f"gpu:{r['name']}:{key}")
                left += v
            ax.text(left, y, f" {left:.1f}", va="center", fontsize=9)
            labels.append((y, f"{r['name']}: {what}, ms"))
            y -= 1
        y -= 0.5
    ax.set_yticks([p for p, _ in labels], [text for _, text in labels], fontsize=9)
    ax.set_xlabel("ms per image (workers: summed over worker threads; consumer: the loop's thread)")
    stages = WORKER_STAGES + CONSUMER_STAGES + (GPU_STAGES if any(map(gpu_decode, split)) else [])
    handles = [matplotlib.patches.Patch(color=c, label=label) for _, label, c in stages]
    ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8,
              frameon=False)


def main():
    if len(sys.argv) != 3 or not sys.argv[2].endswith((".svg", ".png")):
        sys.exit("usage: plot.py BENCH.json OUT.svg|OUT.png")
    with open(sys.argv[1], encoding="utf-8") as f:
        bench = json.load(f)
    runs = bench["runs"]
    plt.rcParams["svg.fonttype"] = "none"  # text stays text
    plt.rcParams["svg.hashsalt"] = "conveyor-bench"  # the same figures, the same file
    fig = plt.figure(figsize=(13, 9.5))
    grid = fig.add_gridspec(2, 2, height_ratios=[1, 1], width_ratios=[1, 1], left=0.07,
                            right=0.76, top=0.83, bottom=0.08, hspace=0.45, wspace=0.55)
    fig.text(0.02, 0.965, "conveyor-bench", fontsize=18, fontweight="bold")
    for k, line in enumerate(bench.get("caption", [])):
        fig.text(0.02, 0.935 - 0.02 * k, line, fontsize=10, color="#444444")
    plot_rates(fig.add_subplot(grid[0, :]), runs)
    plot_latency(fig.add_subplot(grid[1, 0]), runs)
    plot_split(fig.add_subplot(grid[1, 1]), runs)
    fig.savefig(sys.argv[2], metadata={"Date": None} if sys.argv[2].endswith(".svg") else None)


if __name__ == "__main__":
    main()
