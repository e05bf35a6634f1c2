"""PNG figures of a ``p2pfsm bench`` result (``--plot DIR``; needs matplotlib, the ``plot``
extra): latency CDFs of the vLLM/p2pfsm matrix and of the fan-out workload, GB/s vs
block size, per-event cost vs open rounds, GB/s vs concurrency and vs fetch size. Only
what the result holds is drawn."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from p2pfsm.errors import ConfigError

__all__ = ["kind_label", "vllm_label", "write_all"]


def vllm_label(section: dict[str, Any]) -> str:
    """"vLLM <release>" for a result section that names the release it measured
    (``vllm_release``), else "vLLM (release not recorded)"."""
    release = section.get("vllm_release")
    return f"vLLM {release}" if isinstance(release, str) and release else (
        "vLLM (release not recorded)")


def kind_label(kind: str, section: dict[str, Any]) -> str:
    """A matrix side's name in a legend: vLLM's with its release, the others as they are."""
    return vllm_label(section) if kind == "vllm" else kind


def _pyplot() -> Any:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise ConfigError(f"--plot needs matplotlib ({exc}): pip install 'p2pfsm[plot]'") from None
    return plt


def write_all(results: dict[str, Any], directory: str) -> list[Path]:
    """Write every figure the results allow into ``directory``; return their paths."""
    plt = _pyplot()
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths: list[Path] = []
    matrix = results.get("vs_vllm", {})
    cells = matrix.get("cells", {})
    for shape in sorted({c["shape"] for c in cells.values()}):
        fig, ax = plt.subplots(figsize=(6, 4))
        for _key, c in sorted(cells.items()):
            if c["shape"] == shape and c["times_ms"]:
                xs = sorted(c["times_ms"])
                ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))],
                        label=f"{kind_label(c['server'], matrix)} server / "
                              f"{kind_label(c['client'], matrix)} client")
        ax.set(xscale="log", xlabel="fetch latency [ms]", ylabel="fraction of fetches",
               title=f"{shape} fetch: latency CDF")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        ax.legend(fontsize=8)
        paths.append(out / f"latency-cdf-{shape}.png")
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    if results.get("sweep"):
        rows = results["sweep"]
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = [r["block_len"] / 1024 for r in rows]
        for field, label in (("fetch_gbps", "fetch (Node)"), ("raw_gbps", "raw NIXL WRITE"),
                             ("memcpy_gbps", "memcpy")):
            ax.plot(xs, [r[field] for r in rows], marker="o", label=label)
        ax.set(xscale="log", xlabel="block size [KiB]", ylabel="GB/s",
               title="throughput vs block size")
        ax.legend()
        paths.append(out / "gbps-vs-block-size.png")
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    fan = results.get("workloads", {}).get("fanout", {})
    if fan.get("times_ms"):
        fig, ax = plt.subplots(figsize=(6, 4))
        xs = fan["times_ms"]
        ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))])
        ax.set(xscale="log", xlabel="fetch latency [ms]", ylabel="fraction of fetches",
               title=f"{fan['consumers']} consumers fetching 256 x 64 KiB from one producer")
        ax.xaxis.set_minor_formatter(plt.NullFormatter())
        paths.append(out / "latency-cdf-fanout.png")
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    if results.get("fsm"):
        rows = results["fsm"]
        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot([max(r["open_rounds"], 1) for r in rows], [r["per_event_us"] for r in rows],
                marker="o")
        ax.set(xscale="log", xlabel="open rounds (0 drawn at 1)", ylabel="µs per event",
               title="per-event cost vs open rounds", ylim=(0, None))
        paths.append(out / "event-cost-vs-open-rounds.png")
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    paths += _issue29(plt, results, out)
    return paths


def _issue29(plt: Any, results: dict[str, Any], out: Path) -> list[Path]:
    """GB/s vs concurrency (concurrency suite) and vs fetch size (large suite)."""
    paths: list[Path] = []
    conc = results.get("concurrency", {})
    if conc.get("widths"):
        fig, ax = plt.subplots(figsize=(6, 4))
        rows = conc["widths"]
        xs = [r["width"] for r in rows]
        ax.plot(xs, [r["aggregate_gbps"] for r in rows], marker="o",
                label="p2pfsm: C concurrent fetches")
        ax.plot(xs, [r["single_gbps"] for r in rows], marker="o", linestyle="--",
                label="p2pfsm: one fetch of all C x 4 blocks")
        if conc.get("vllm"):
            ax.plot([r["width"] for r in conc["vllm"]],
                    [r["aggregate_gbps"] for r in conc["vllm"]], marker="s",
                    label=f"{vllm_label(conc)}: C concurrent fetches")
        ax.set(xscale="log", xlabel="concurrent fetches of 4 x 64 KiB (C)",
               ylabel="aggregate GB/s", title="GB/s vs concurrency (one session)", ylim=(0, None))
        ax.legend(fontsize=8)
        paths.append(out / "gbps-vs-concurrency.png")
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    cells = results.get("large", {}).get("cells", [])
    if cells:
        fig, ax = plt.subplots(figsize=(6, 4))
        for bl in sorted({c["block_len"] for c in cells}):
            mine = [c for c in cells if c["block_len"] == bl]
            xs = [c["total"] / 2**20 for c in mine]
            ax.plot(xs, [c["fetch_gbps"] for c in mine], marker="o",
                    label=f"fetch, {bl // 1024} KiB blocks")
            ax.plot(xs, [c["raw_gbps"] for c in mine], marker="x", linestyle="--",
                    label=f"raw WRITE, {bl // 1024} KiB blocks")
        ax.set(xscale="log", xlabel="fetch size [MiB]", ylabel="GB/s",
               title="GB/s vs fetch size", ylim=(0, None))
        ax.legend(fontsize=8)
        paths.append(out / "gbps-vs-size.png")
        fig.savefig(paths[-1], dpi=100, bbox_inches="tight")
        plt.close(fig)
    return paths
