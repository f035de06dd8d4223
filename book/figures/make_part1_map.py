"""Draw the Part I summary diagram (book/figures/part1_map.svg).

Run from the repository root:  python book/figures/make_part1_map.py
Each box is one idea of Part I; each arrow is labelled with the problem that leads from one
idea to the next. Box 1 shows the policy gradient with its factor gamma^t (chapter 1's
eq-ch01-pg-rtg); the estimator without gamma^t has another mean unless gamma = 1 (chapter 2).
The output is reproducible: no date in the metadata and a fixed hash salt for the SVG ids.
"""
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

BOXES = {
    "pg": (0.16, 0.84, "1  Policy gradient\n"
                       "$\\nabla J = \\mathbb{E}[\\sum_t \\gamma^t\\,\\nabla\\log\\pi\\,G_t]$\nREINFORCE"),
    "adv": (0.16, 0.50, "2  Baselines, advantages\n$A = Q - V$, GAE($\\lambda$)"),
    "is": (0.50, 0.84, "3  Importance sampling\n$\\rho = \\pi/\\mu$, Var $= \\chi^2$"),
    "kl": (0.84, 0.84, "4  KL trust regions\nTRPO, PPO-penalty, PPO-clip"),
    "off": (0.84, 0.50, "5  On/off-policy, drift\nreward hacking, KL to $\\pi_{\\mathrm{ref}}$"),
    "sys": (0.50, 0.50, "6  Entropy, KL, learning rate\none coupled system"),
    "llm": (0.50, 0.15, "7  To language models\nprompt = state, response = action\nGRPO: group baseline, no critic"),
}
ARROWS = [
    ("pg", "adv", "high variance"),
    ("pg", "is", "one use per sample"),
    ("is", "kl", "weights explode\nas policies drift"),
    ("kl", "off", "reuse a batch\nK epochs"),
    ("off", "sys", "too large a step"),
    ("sys", "kl", "KL-triggered\nlr control"),
    ("adv", "llm", ""),
    ("sys", "llm", ""),
    ("off", "llm", ""),
]


OUT = Path(__file__).with_name("part1_map.svg")


def main(out=OUT):
    plt.rcParams["svg.hashsalt"] = "part1-map"
    fig, ax = plt.subplots(figsize=(9.5, 6.2))
    ax.set_xlim(0, 1)
    ax.set_ylim(0, 1)
    ax.axis("off")
    w, h = 0.27, 0.17
    for key, (x, y, text) in BOXES.items():
        color = "#fde9d9" if key == "llm" else "#e8f0fa"
        ax.add_patch(FancyBboxPatch((x - w / 2, y - h / 2), w, h, boxstyle="round,pad=0.01,rounding_size=0.02",
                                    fc=color, ec="#1f4e79", lw=1.2))
        ax.text(x, y, text, ha="center", va="center", fontsize=9.5)
    for a, b, label in ARROWS:
        (xa, ya, _), (xb, yb, _) = BOXES[a], BOXES[b]
        dx, dy = xb - xa, yb - ya
        # start and end on the box borders
        sx = min(1.0, (w / 2 + 0.01) / abs(dx)) if dx else 1e9
        sy = min(1.0, (h / 2 + 0.01) / abs(dy)) if dy else 1e9
        s = min(sx, sy)
        start = (xa + s * dx, ya + s * dy)
        end = (xb - s * dx, yb - s * dy)
        rad = 0.25 if (a, b) == ("sys", "kl") else 0.0
        ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=14, lw=1.3,
                                     color="#333333", connectionstyle=f"arc3,rad={rad}"))
        if label:
            mx, my = (start[0] + end[0]) / 2, (start[1] + end[1]) / 2
            off = (0.0, 0.055) if abs(dy) < 1e-9 else (0.07 if rad == 0 else -0.07, 0.0)
            if (a, b) == ("sys", "kl"):
                off = (0.075, -0.035)
            ax.text(mx + off[0], my + off[1], label, ha="center", va="center", fontsize=8.5,
                    style="italic", color="#7f1d1d")
    fig.tight_layout()
    fig.savefig(out, format="svg", bbox_inches="tight", metadata={"Date": None})
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
