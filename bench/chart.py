"""The two charts: batch wall time against injected latency, and cost per million against memory size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on CI or a server

import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter

from bench.report import TARGET_MEMORY_MB, BenchResults
from bench.systems import NAMES

_COLOURS = ("#1b7f3b", "#c0392b", "#7f8c8d")
_STYLES = {1: ("--", "s"), 10: ("-", "o")}


def _save(figure: Any, axis: Any, title: str, path: Path) -> None:
    axis.legend(fontsize=8)
    axis.set_title(title)
    figure.tight_layout()
    figure.savefig(path, dpi=110)
    plt.close(figure)


def draw_batch_latency_chart(results: BenchResults, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7.5, 5.4))
    for size, (style, marker) in _STYLES.items():
        for name, colour in zip(NAMES, _COLOURS, strict=True):
            points = [
                (latency, samples[name])
                for latency in results.latencies_ms
                if name in (samples := results.samples(TARGET_MEMORY_MB, latency, size))
            ]
            if not points:
                continue
            medians = [sample.median_s * 1000 for _, sample in points]
            bars = [(m - s.ci_s[0] * 1000, s.ci_s[1] * 1000 - m) for m, (_, s) in zip(medians, points, strict=True)]
            label = f"{name}, batch of {size}"
            line: dict[str, Any] = dict(color=colour, linestyle=style, marker=marker, capsize=3, label=label)
            axis.errorbar([latency for latency, _ in points], medians, yerr=list(zip(*bars, strict=True)), **line)
    axis.set_yscale("log")
    axis.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    axis.set_xlabel("injected DynamoDB latency per request (ms)")
    axis.set_ylabel("invocation wall time (ms, log scale): median, bar = 95% CI")
    axis.set_xticks(results.latencies_ms)
    axis.grid(True, which="both", alpha=0.3)
    _save(figure, axis, f"SQS batch at {TARGET_MEMORY_MB} MB's CPU share, DynamoDB Local + conflict emulation", path)


def draw_cost_chart(results: BenchResults, path: Path) -> None:
    figure, axis = plt.subplots(figsize=(7.5, 5.0))
    for name, colour in zip(NAMES, _COLOURS, strict=True):
        points = [(memory, cost) for memory in results.memory_sizes_mb if (cost := results.cost(name, memory))]
        if not points:
            continue
        memories = [memory for memory, _ in points]
        axis.plot(memories, [cost.total_usd for _, cost in points], color=colour, marker="o", label=f"{name}: total")
        lambda_usd = [cost.lambda_usd for _, cost in points]
        axis.plot(memories, lambda_usd, color=colour, marker=".", linestyle=":", label=f"{name}: of which Lambda")
    axis.set_xlabel("function memory size (MB); CPU share = MB / 1769")
    axis.set_ylabel("USD per million messages (us-east-1)")
    axis.set_xticks(results.memory_sizes_mb)
    axis.set_ylim(bottom=0)
    axis.grid(True, alpha=0.3)
    _save(figure, axis, "Cost per million new messages, batches of 10, 10 ms DynamoDB latency", path)
