"""A random `Batch` with every field filled (tests, tracing, benchmarks).

Library code traces algorithms on it (`rljax.training` asks which fields an
algorithm reads); `rljax.testing` re-exports it.
"""

import numpy as np

from rljax._src.base import Batch


def random_batch(
  seed: int = 0,
  *,
  prompts: int = 4,
  samples: int = 4,
  tokens: int = 6,
  dtype=np.float32,
  vocab: int = 16,
) -> Batch:
  """A `Batch` with every field filled by plausible random values.

  Completions have random lengths >= 1, rewards are 0/1 (binary
  verifiers), log-probs are negative and the old, rollout and reference
  policies sit within a few tenths of a nat of each other (the teacher a
  little further); prompt ids are 0..P-1 and token ids lie in [0, vocab).
  """
  rng = np.random.default_rng(seed)
  shape = (prompts, samples, tokens)
  lengths = rng.integers(1, tokens + 1, size=shape[:2])
  mask = (np.arange(tokens) < lengths[..., None]).astype(dtype)
  old_logp = -rng.gamma(2.0, 0.5, size=shape)
  near = lambda scale: old_logp + rng.normal(0.0, scale, size=shape)  # noqa: E731
  rewards_pgk = rng.integers(0, 2, size=(*shape[:2], 2)).astype(dtype)
  return Batch(
    mask_PGT=mask,
    rewards_PG=rewards_pgk[..., 0],
    rewards_PGK=rewards_pgk,
    old_logp_PGT=old_logp.astype(dtype),
    ref_logp_PGT=near(0.2).astype(dtype),
    rollout_logp_PGT=near(0.1).astype(dtype),
    old_values_PGT=rng.uniform(0.0, 1.0, size=shape).astype(dtype),
    old_entropy_PGT=rng.uniform(0.0, 2.0, size=shape).astype(dtype),
    truncated_PG=lengths == tokens,
    baseline_rewards_P=rng.integers(0, 2, size=shape[:1]).astype(dtype),
    prompt_ids_P=np.arange(prompts, dtype=np.int32),
    tokens_PGT=rng.integers(0, vocab, size=shape).astype(np.int32),
    teacher_logp_PGT=near(0.3).astype(dtype),
  )
