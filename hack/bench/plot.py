#!/usr/bin/python3
"""Draw the charts of a benchmark's summary.json: every configuration's
median relative to the kernel veth, higher is better on every bar (latency
and CPU are shown as kernel/this, so 1.0 is "as good as the kernel").

ratios.png has every configuration; peers.png has cni-usernet beside its
peers (gVisor runsc, pasta, slirp4netns) when the run had them."""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

# (metric key, label, True if lower is better and the ratio is inverted)
BARS = [
    ("tcp_n2p_gbps", "TCP node→pod", False),
    ("tcp_p2n_gbps", "TCP pod→node", False),
    ("redis_set_krps", "redis SET", False),
    ("redis_get_krps", "redis GET", False),
    ("nginx_rps", "nginx 10 MiB", False),
    ("rr_p50_us", "TCP_RR p50 (kernel/this)", True),
    ("cpu_gb_p2n", "CPU per GB pod→node (kernel/this)", True),
    ("cpu_redis", "CPU per redis request (kernel/this)", True),
]

# The peers chart: the kernel, cni-usernet's GSO modes, the peers.
PEER_CHART = ["kernel", "usernet-hardware", "usernet-software", "usernet-off",
              "runsc-hostgso", "runsc-softgso", "pasta-tap", "slirp4netns"]


def draw(s, configs, path, title):
    cells = s["cells"]
    status = {c["name"]: c.get("status", "ran") for c in s["configs"]}
    fig, ax = plt.subplots(figsize=(max(8, 1.7 * len(configs)), 5.5))
    width = 0.8 / len(BARS)
    for i, (key, label, inverted) in enumerate(BARS):
        ys = []
        for c in configs:
            r = cells.get(c, {}).get(key, {}).get("ratio")
            ys.append((1 / r if inverted and r else r) or 0)
        xs = [j + (i - (len(BARS) - 1) / 2) * width for j in range(len(configs))]
        ax.bar(xs, ys, width, label=label)
        for x, y in zip(xs, ys):
            if not y:  # no number: failed or not measured (table.md says why)
                ax.text(x, 0.01, "×", ha="center", fontsize="small", color="red")
    for j, c in enumerate(configs):
        if not status.get(c, "ran").startswith("ran"):
            ax.text(j, 0.05, "did not run", rotation=90, ha="center", fontsize="small")
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.6, color="grey", linewidth=0.8, linestyle="--", label="0.6 target")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, rotation=20, ha="right")
    ax.set_ylabel("relative to %s (median)" % s["baseline"])
    ax.set_title(title)
    ax.legend(fontsize="small", ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def main(out):
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    cells = s["cells"]
    # The pod-to-pod rows (xnode-* across nodes, pod2pod-* on one node)
    # measure against their own kernel rows: table.md has them, these
    # charts do not.
    pod2pod = ("xnode", "pod2pod")
    configs = [c["name"] for c in s["configs"]
               if c["name"] in cells and not c["name"].startswith(pod2pod)]
    if not configs:
        if any(c.startswith(pod2pod) for c in cells):
            return 0
        print("plot: no numbers to draw", file=sys.stderr)
        return 1
    draw(s, configs, os.path.join(out, "ratios.png"),
         "cni-usernet benchmark: ratio to the kernel veth, higher is better")
    names = [c["name"] for c in s["configs"]]
    peers = [c for c in PEER_CHART if c in names]
    if any(c.startswith(("runsc", "pasta", "slirp")) for c in peers):
        draw(s, peers, os.path.join(out, "peers.png"),
             "cni-usernet beside its peers: ratio to the kernel veth of the same run, higher is better")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
