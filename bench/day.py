"""One emulated day of serving by day and training by night on cm384, in model mode (issue 24
item 5; emulator/model/dayplan.py): DeepSeek-R1 served at its 50 ms TPOT operating point
(examples/deployments/deepseek-r1.yaml, 4,096 + 256 tokens per request) under a diurnal demand,
and DeepSeek-V3 trained on the NPUs serving does not need. For each policy (serving all day, a
calendar night window, a load-following one): tokens served against demand, training steps and
tokens, NPU-hours lent, and every switch with its time and cost. Writes day.json and day.png.

    python bench/day.py [--peak 300000] [--results DIR]   (about 10 s on one core)
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

import yaml

from cmemu.emulator.model.dayplan import POLICIES, DayResult, params_for, simulate_day
from cmemu.emulator.model.serving.deployment import parse_deployment, profile_of

try:
    from bench import outputs
except ModuleNotFoundError:  # run as a script (python bench/X.py): bench/ itself is on the path
    import outputs  # type: ignore[import-not-found, no-redef]

ROOT = Path(__file__).resolve().parents[1]
DEPLOYMENT = ROOT / "examples" / "deployments" / "deepseek-r1.yaml"
PROMPT, OUTPUT = 4096.0, 256.0  # examples/workloads/decode-4096-256.yaml


def run(peak: float) -> dict[str, DayResult]:
    deployment = parse_deployment(yaml.safe_load(DEPLOYMENT.read_text()))
    profile = profile_of(deployment)
    params = params_for(
        deployment,
        peak_tokens_per_s=peak,
        prompt_tokens=PROMPT,
        output_tokens=OUTPUT,
        profile=profile,
    )
    return {
        policy: simulate_day(
            dataclasses.replace(params, policy=policy), preset=deployment.preset, profile=profile
        )
        for policy in POLICIES
    }


def report(days: dict[str, DayResult]) -> None:
    for policy, d in days.items():
        print(
            f"{policy:<11} served {d.served_tokens / 1e9:6.2f} of {d.demand_tokens / 1e9:.2f} "
            f"G tokens ({d.served_fraction:.2%}), {d.training_steps:6,.0f} training steps "
            f"({d.training_tokens / 1e9:.2f} G tokens, {d.training_npu_hours:,.0f} NPU-hours), "
            f"{len(d.switches)} switches"
        )
        for s in d.switches[:4]:
            print(f"    {s.at_s / 3600:05.2f} h: {s.npus} NPUs to {s.to}, {s.duration_s:,.0f} s")
        if len(d.switches) > 4:
            print(f"    ... {len(d.switches) - 4} more")


def plot(days: dict[str, DayResult], directory: Path) -> None:
    shown = [p for p in POLICIES if p != "serve-only"]
    with outputs.figure(directory, "day", ncols=len(shown), title="cm384: one day") as axes:
        for ax, policy in zip(axes, shown, strict=True):
            hours = days[policy].hours
            outputs.over_time(
                ax,
                [h.hour for h in hours],
                {
                    "serving NPUs": [h.serving_npus for h in hours],
                    "training NPUs": [h.training_npus for h in hours],
                    "demand (k tokens/s)": [h.demand_tokens / 3600 / 1e3 for h in hours],
                },
                xlabel="hour",
                title=policy,
            )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--peak", type=outputs.positive, default=300_000.0, help="tokens/s at the peak"
    )
    outputs.add_option(parser)
    args = parser.parse_args()
    started = time.process_time()
    days = run(args.peak)
    cpu_s = time.process_time() - started
    report(days)
    print(f"cpu_s {cpu_s:.1f}")
    doc = {"peak_tokens_per_s": args.peak, "cpu_s": cpu_s}
    doc |= {policy: d.to_dict() for policy, d in days.items()}
    outputs.write_json(args.results, "day", doc)
    plot(days, args.results)
    outputs.announce(args.results, "day")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
