"""Batch wall time against injected DynamoDB latency, one panel per batch size."""

from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI or a server

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from bench.results import DYNAMODB_LOCAL, MOTO, BenchResults

_COLOURS = ("#1b7f3b", "#c0392b", "#7f8c8d")
_BACKEND_STYLES = ("-", "--")
_MARKERS = ("o", "s")


def draw_batch_latency_chart(results: BenchResults, path: Path) -> None:
    sizes = [size for size in results.batch_sizes if size > 1]
    figure, axes = plt.subplots(1, len(sizes), figsize=(6.2 * len(sizes), 5.4), squeeze=False)
    for axis, size in zip(axes[0], sizes, strict=True):
        for backend, style, marker in zip(results.backends, _BACKEND_STYLES, _MARKERS, strict=False):
            for name, colour in zip(results.systems, _COLOURS, strict=False):
                points = [
                    (latency, samples[name])
                    for latency in results.latencies_ms
                    if (samples := results.samples(backend, latency, size)) and name in samples
                ]
                if not points:
                    continue
                latencies = [latency for latency, _ in points]
                medians = [sample.median_s * 1000 for _, sample in points]
                above = [(sample.p99_s - sample.median_s) * 1000 for _, sample in points]
                axis.errorbar(
                    latencies,
                    medians,
                    yerr=[[0] * len(above), above],
                    color=colour,
                    linestyle=style,
                    marker=marker,
                    capsize=3,
                    label=f"{name} ({backend})",
                )
        axis.set_yscale("log")
        axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
        axis.yaxis.set_minor_formatter(FuncFormatter(lambda value, _: f"{value:g}" if str(value)[0] in "25" else ""))
        axis.set_title(f"batch of {size} records")
        axis.set_xlabel("injected DynamoDB latency per request (ms)")
        axis.set_ylabel("batch wall time (ms, log scale): median, bar up to p99")
        axis.set_xticks(results.latencies_ms)
        axis.grid(True, which="both", alpha=0.3)
    handles, labels = axes[0][0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=len(results.backends), fontsize=9, frameon=False)
    figure.suptitle(f"SQS batch wall time against DynamoDB latency (solid: {MOTO}, dashed: {DYNAMODB_LOCAL})")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=110)
    plt.close(figure)
