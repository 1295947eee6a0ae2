"""A part of the design study as a committed table, from the records the pipeline wrote so far.

    .venv/bin/python benchmarks/study_snapshot.py --variants key_routing query query_unrotated query_neutral --tag part1

The study's own table (rule study) needs every variant of configs/study.yaml; the study runs in parts (each within
one sitting on a CPU), and each part's numbers are committed as they come: benchmarks/results/study_<tag>.{csv,md}
and the training-curve figure. Cells not measured yet are dashes.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml

from focus.report.study import write_study


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", nargs="+", required=True)
    parser.add_argument("--tag", required=True)
    parser.add_argument("--profile", default="configs/study.yaml")
    parser.add_argument("--out", default="benchmarks/results")
    args = parser.parse_args()

    profile = yaml.safe_load(Path(args.profile).read_text())
    results, model, domain = Path("results") / profile["name"], profile["study"].get("model"), profile["study"]["domain"]
    model = model or next(iter(profile["models"]))
    variants = {name: profile["variants"][name] for name in args.variants}
    train = [results / "train" / model / name for name in variants]
    found = sorted((results / "perplexity" / model).glob("*/*.json"))
    frame = write_study(
        model=model, variants=variants, domain=domain,
        summaries=[folder / "summary.json" for folder in train if (folder / "summary.json").is_file()],
        metrics=[folder / "metrics.jsonl" for folder in train if (folder / "metrics.jsonl").is_file()],
        validation=[path for path in found if path.name.endswith(".validation.json")],
        test=[path for path in found if not path.name.endswith(".validation.json")],
        long_context=sorted((results / "long_context" / model).glob("*/ctx*.json")),
        needle=sorted((results / "long_context" / model).glob("*/needle.json")),
        interpret=[path for path in sorted((results / "interpret" / model).glob("*/summary.json"))
                   if path.parent.name in variants],
        table=Path(args.out) / f"study_{args.tag}.csv",
        figure=Path(args.out) / f"study_{args.tag}_curves.png",
    )
    print(Path(args.out, f"study_{args.tag}.md").read_text())
    print(f"{len(frame) - 1} designs; cells not measured yet: {int(frame.isna().sum().sum())}")


if __name__ == "__main__":
    main()
