"""How often noise flips compare's call: the table of docs/diagnose.md ("How much noise can
flip the call"), from `diagnose.switch_noise` (the unit tests run its short form).

    .venv/bin/python bench/switch_noise.py --runs 40

For each noise level and round count: identical engines (how many of `--runs` runs switch,
and how many call A ahead), engines 10 % and 30 % apart (how many switch), and the smallest
difference called in 19 of 20 runs.
"""

from __future__ import annotations

import argparse

from diagnose.switch_noise import Noise, outcome, smallest_called

NOISES = (Noise(0.03, 0.03, 0.10), Noise(0.05, 0.05, 0.10))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=40, help="runs per cell (default 40)")
    p.add_argument("--rounds", default="1,2,3", help="round counts (default 1,2,3)")
    p.add_argument(
        "--noise",
        action="append",
        metavar="R,W,Q",
        help="round, wave and request noise (default 0.03,0.03,0.10 and 0.05,0.05,0.10)",
    )
    p.add_argument("--no-header", action="store_true", help="rows only")
    args = p.parse_args()
    noises = (
        [Noise(*(float(x) for x in n.split(","))) for n in args.noise] if args.noise else NOISES
    )
    if not args.no_header:
        print(
            "| round / wave / request noise | rounds | identical: switch (A ahead) | 10 %: switch "
            "| 30 %: switch | smallest called 19 in 20 |"
        )
        print("|---|---|---|---|---|---|")
    for noise in noises:
        for rounds in (int(x) for x in args.rounds.split(",")):
            same = outcome(0.0, rounds, args.runs, noise=noise)
            d10 = outcome(0.10, rounds, args.runs, noise=noise)
            d30 = outcome(0.30, rounds, args.runs, noise=noise)
            least = smallest_called(rounds, noise=noise)
            label = f"{noise.round:.0%} / {noise.wave:.0%} / {noise.request:.0%}"
            print(
                f"| {label} | {rounds} | {same.switch}/{args.runs} ({same.stay_ahead}) | "
                f"{d10.switch}/{args.runs} | {d30.switch}/{args.runs} | "
                f"{'> 100 %' if least is None else f'{least:.0%}'} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
