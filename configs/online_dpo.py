"""Online DPO on 2-digit addition from the configs/sft.py policy: each step
samples 8 completions of each prompt from the current policy, scores them
with the task's reward and trains DPO on the best against the worst
(a margin of at least 0.5). With train.reference_resets the reference
becomes the current policy at those steps: DNO's iterative DPO (arXiv
2404.03715; VerIPO's loop with a verifier as the reward), and
algorithm.kwargs.apo_alpha > 0 adds APO's extrapolation (arXiv
2410.06293).

python -m rljax.training --config configs/sft.py
python -m rljax.training --config configs/online_dpo.py
"""

import dataclasses

from _arithmetic import base

from rljax.training import AlgorithmSpec
from rljax.training import DataSpec
from rljax.training import OptimSpec
from rljax.training import OutputSpec

# What this run reads that a fresh clone lacks, and the command (from the
# repository root) that makes it: the CLI names it when the path is missing.
PREREQUISITES = {
  "runs/sft/model": "python -m rljax.training --config configs/sft.py",
}


def get_config():
  config = base("grpo")
  return dataclasses.replace(
    config,
    kind="preference",
    model=dataclasses.replace(config.model, source="hf:runs/sft/model"),
    sampler=dataclasses.replace(config.sampler, num_samples=8),
    # The offline demo's settings (configs/dpo.py): beta 0.1 hurt accuracy.
    algorithm=AlgorithmSpec(
      name="dpo", kwargs={"beta": 0.5, "min_margin": 0.5}
    ),
    data=DataSpec(source="online"),
    optim=OptimSpec(learning_rate=2e-5, grad_clip=1.0),
    train=dataclasses.replace(
      config.train,
      steps=60,
      warm_start_steps=0,
      eval_every=20,
      reference_resets=(20, 40),
    ),
    output=OutputSpec(directory="runs/online_dpo", rollouts_every=10),
  )
