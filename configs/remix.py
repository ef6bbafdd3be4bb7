"""ReMix on 2-digit addition (see _arithmetic.py).

Reincarnating Mix-policy Proximal Policy Gradient (arXiv 2507.06892): each
group of 16 mixes 12 fresh samples with 4 replayed samples of the same
prompt drawn by the policies of the last 4 steps
(`rljax.rollouts.MixPolicyReplay`, their sampler log-probs kept as mu),
trained with PPO's clip on pi_theta / mu and the KL-Convex penalty
0.5 KL(pi || base) + 0.5 KL(pi || precedent) (preset `remix`), two passes
over each batch (update-to-data ratio 2). Replay is per prompt, so the
training set is cut to 64 problems: with 16 prompts a step each returns
every 4 steps, inside the window. From step 30 on (policy reincarnation)
the groups are on-policy again and the KL is to the base alone, the base
being the policy as it was at step 30 (``train.reference_resets``). Window,
share, lambda and the reincarnation step are our choices (the paper's
were not verified).

python -m rljax.training --config configs/remix.py [train.steps=100 ...]
"""

from _arithmetic import base

REINCARNATE_AT = 30


def get_config():
  return base(
    "remix",
    reincarnate_at=REINCARNATE_AT,
    task={"kwargs": {"digits": 2, "prompt_style": "bare", "train_size": 64}},
    sampler={
      "groups": "mix_policy_replay",
      "groups_kwargs": {
        "window": 4,
        "num_replayed": 4,
        "reincarnate_at": REINCARNATE_AT,
      },
    },
    train={"epochs": 2, "reference_resets": (REINCARNATE_AT,)},
  )
