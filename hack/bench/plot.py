#!/usr/bin/python3
"""Draw ratios.png from a benchmark's summary.json: every configuration's
median relative to the kernel veth, higher is better on every bar (latency
is shown as kernel/this, so 1.0 is "as good as the kernel")."""
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
]


def main(out):
    with open(os.path.join(out, "summary.json")) as f:
        s = json.load(f)
    cells = s["cells"]
    configs = [c["name"] for c in s["configs"] if c["name"] in cells]
    if not configs:
        print("plot: no numbers to draw", file=sys.stderr)
        return 1
    fig, ax = plt.subplots(figsize=(max(8, 1.6 * len(configs)), 5))
    width = 0.8 / len(BARS)
    for i, (key, label, inverted) in enumerate(BARS):
        ys = []
        for c in configs:
            r = cells[c].get(key, {}).get("ratio")
            ys.append((1 / r if inverted and r else r) or 0)
        xs = [j + (i - (len(BARS) - 1) / 2) * width for j in range(len(configs))]
        ax.bar(xs, ys, width, label=label)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.axhline(0.6, color="grey", linewidth=0.8, linestyle="--", label="0.6 target")
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(configs, rotation=20, ha="right")
    ax.set_ylabel("relative to %s (median)" % s["baseline"])
    ax.set_title("cni-usernet benchmark: ratio to the kernel veth, higher is better")
    ax.legend(fontsize="small", ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.3))
    fig.tight_layout()
    fig.savefig(os.path.join(out, "ratios.png"), dpi=110, bbox_inches="tight")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
