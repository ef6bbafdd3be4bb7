"""The README's main command: the arithmetic GRPO demo learns and does not
collapse (the full run, about three minutes on 2 cores)."""

import pytest


@pytest.mark.slow
def test_grpo_demo_raises_held_out_accuracy(grpo_demo):
  directory, summary = grpo_demo
  before = summary["before"]["eval_accuracy"]
  after = summary["after"]["eval_accuracy"]
  # Where the warm start lands is chaotic: XLA's reduction order differs with
  # the device count and the CPU, and 800 constant-rate Adam steps amplify it
  # (measured, experiments/demo_robustness.py: before 46-90% over seeds 0-2
  # x 1 and 8 devices). RL's gain is what holds: +4.7 to +16.0 points
  # (median +7.4) in those six runs, +9.4 and +21.8 in the two that issue 11
  # reported on another machine. Two points keep a margin over the smallest
  # and still fail a run that does not learn.
  assert after >= before + 0.02, (before, after)
  # No collapse: every periodic evaluation stays near or above the start.
  evals = [
    h["eval_accuracy"] for h in summary["history"] if "eval_accuracy" in h
  ]
  assert min(evals) >= before - 0.1, evals
  assert (directory / "learning_curves.png").stat().st_size > 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["rec", "bapo", "ares", "gtpo"])
def test_literature_preset_trains_the_demo_near_grpo(
  tmp_path, grpo_demo, train_demo, name
):
  # docs/figures/presets_accuracy.json, seeds 0-2 against grpo: rec (a
  # clip variant) -2.7 to -0.4 points, bapo (bounds searched each step)
  # -1.2 to +2.3, ares (a stateful reward) -1.2 to 0.0, gtpo (token-level
  # credit) -1.2 to -0.8. RiskPO with its paper's defaults ends up to 10.9
  # points below and is not asserted.
  after = train_demo(tmp_path, f"algorithm.name={name}")["after"][
    "eval_accuracy"
  ]
  assert after >= grpo_demo[1]["after"]["eval_accuracy"] - 0.05
