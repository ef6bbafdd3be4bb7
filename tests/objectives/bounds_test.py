"""Loss stages with adaptive / per-token bounds: BAPO's minibatch search,
AEPO's entropy statistics, R^2VPO's dual variable (measure / observe), the
per-token-bound stages, micro-batching, and the bapo / dcpo presets."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import advantages
from rljax import aggregate
from rljax import testing
from rljax import transforms
from rljax.algorithms import _bounds as presets
from rljax.losses import _bounds as L
from rljax.objectives import _bounds as S

HALVES = (slice(0, 2), slice(2, 4))


def _half(batch, s):
  return jax.tree.map(lambda x: x[s], batch)


def _sum(parts):
  return functools.reduce(lambda a, b: jax.tree.map(jnp.add, a, b), parts)


def _prepared(seed=0, *stages, scale=0.6):
  """A random batch with GRPO advantages (and `stages`), prepared, and
  current log-probs about `scale` nats from the old ones."""
  batch = testing.random_batch(seed)
  sample_mask = np.ones(batch.shape[:2], np.float32)
  sample_mask[1, 2] = 0.0  # a filtered sample
  batch = batch._replace(sample_mask_PG=sample_mask)
  prep = rljax.Algorithm(
    rljax.chain(transforms.group_advantages(advantages.grpo), *stages),
    aggregate.token_mean,
  )
  batch, _ = prep.prepare(batch, prep.init())
  return batch, testing.perturbed_logp(batch, seed=seed + 1, scale=scale)


def _observed(algo, batch, logp, entropy=None, state=None):
  state = algo.init() if state is None else state
  stats = algo.measure(logp, batch, state, entropy_PGT=entropy)
  return algo.observe(state, stats)


def _check_micro_batching(algo, batch, logp, state, entropy=None):
  """Loss and gradient of the whole = the halves' Means summed."""

  @jax.jit
  def run(lp, b, h):
    def num(x):
      loss = algo.loss(x, b, state, entropy_PGT=h)[0]
      return loss.num, loss

    (_, loss), grad = jax.value_and_grad(num, has_aux=True)(lp)
    return loss, grad

  ent = (lambda s: None) if entropy is None else (lambda s: entropy[s])
  whole, g_num = run(logp, batch, entropy)
  den = whole.den if whole.den != 0 else 1.0
  parts = [run(logp[s], _half(batch, s), ent(s)) for s in HALVES]
  total = _sum([p[0] for p in parts])
  np.testing.assert_allclose(total.value, whole.value, rtol=1e-5, atol=1e-7)
  np.testing.assert_allclose(total.den, whole.den, rtol=1e-6)
  g_whole = np.asarray(g_num) / den
  g_parts = np.concatenate([p[1] for p in parts]) / den
  np.testing.assert_allclose(g_parts, g_whole, rtol=1e-4, atol=1e-7)
  assert np.any(g_whole != 0)
  return whole, g_whole


# --------------------------------------------------------------------------
# BAPO


def _np_bapo_ratios(batch, logp):
  """P / N of every candidate over the whole minibatch (float64)."""
  mask = np.asarray(batch.loss_mask(), np.float64)
  adv = np.asarray(batch.advantages_PGT, np.float64)
  r = np.exp(np.float64(logp) - batch.old_logp_PGT)
  ratios = []
  for lo, hi in zip(*L.bapo_candidates(), strict=True):
    eff = np.where(adv >= 0, np.minimum(r, hi), np.maximum(r, lo)) * adv
    pos = (mask * np.maximum(eff, 0)).sum()
    ratios.append(pos / (mask * np.maximum(-eff, 0)).sum())
  return ratios


def test_bapo_measure_of_halves_sums_to_the_whole_and_observe_searches():
  batch, logp = _prepared(0)
  # rho0 just below the last candidate that beats all earlier ones: the
  # search over the WHOLE minibatch must stop exactly there (c_hi stage).
  ratios = _np_bapo_ratios(batch, logp)
  records = [
    k for k in range(len(ratios)) if ratios[k] > max(ratios[:k] or [0])
  ]
  k = records[-1]
  assert k > 6
  rho0 = ratios[k] - 0.3 * (ratios[k] - max(ratios[:k]))
  algo = rljax.Algorithm(S.bapo(rho0=rho0), aggregate.token_mean)
  whole = algo.measure(logp, batch, algo.init())
  parts = [algo.measure(logp[s], _half(batch, s), algo.init()) for s in HALVES]
  for name in ("positive", "negative"):
    np.testing.assert_allclose(
      _sum(parts)[name].value, whole[name].value, rtol=1e-5
    )
  lows, highs = L.bapo_candidates()
  for stats in (whole, _sum(parts)):
    state = algo.observe(algo.init(), stats)
    np.testing.assert_allclose(
      [state.clip_low, state.clip_high], [lows[k], highs[k]], rtol=1e-6
    )
    np.testing.assert_allclose(state.ratio, ratios[k], rtol=1e-4)


def test_bapo_apply_uses_the_observed_bounds_and_is_exact_when_split():
  batch, logp = _prepared(1)
  rho0 = 1.01 * max(_np_bapo_ratios(batch, logp))  # out of reach: the max
  algo = rljax.Algorithm(S.bapo(rho0=rho0), aggregate.token_mean)
  state = _observed(algo, batch, logp)
  whole, grad = _check_micro_batching(algo, batch, logp, state)
  mask = batch.loss_mask()
  ref = L.ppo_clip_bounds(
    logp, batch.old_logp_PGT, batch.advantages_PGT, mask,
    ratio_low=state.clip_low, ratio_high=state.clip_high, dual_clip=3.0,
  )  # fmt: skip
  np.testing.assert_allclose(
    whole.value, aggregate.token_mean(ref.loss, mask).value, rtol=1e-6
  )
  metrics = rljax.finalize(algo.loss(logp, batch, state)[1])
  np.testing.assert_allclose(metrics["bapo_clip_high"], state.clip_high)
  np.testing.assert_allclose([state.clip_low, state.clip_high], [0.9, 3.0])


# --------------------------------------------------------------------------
# AEPO


def test_aepo_entropy_statistics_are_the_minibatch_ones():
  algo = rljax.Algorithm(S.aepo(), aggregate.token_mean)
  batch, logp = _prepared(2)
  entropy = np.asarray(batch.old_entropy_PGT) * 1.1
  state = _observed(algo, batch, logp, entropy)
  valid = np.asarray(batch.loss_mask()) > 0
  h = np.float64(entropy)[valid]
  np.testing.assert_allclose(state.mean, h.mean(), rtol=1e-5)
  np.testing.assert_allclose(state.std, h.std(ddof=1), rtol=1e-4)
  parts = [
    algo.measure(logp[s], _half(batch, s), algo.init(), entropy_PGT=entropy[s])
    for s in HALVES
  ]
  halves = algo.observe(algo.init(), _sum(parts))
  np.testing.assert_allclose(halves, state, rtol=1e-5)
  whole, _ = _check_micro_batching(algo, batch, logp, state, entropy)
  z = (entropy - h.mean()) / h.std(ddof=1)
  ref = L.aepo(
    logp, batch.old_logp_PGT, batch.advantages_PGT, batch.loss_mask(),
    entropy_z_BT=z.astype(np.float32),
  )  # fmt: skip
  np.testing.assert_allclose(
    whole.value,
    aggregate.token_mean(ref.loss, batch.loss_mask()).value,
    rtol=1e-5,
  )
  with pytest.raises(ValueError, match="entropy_PGT"):
    algo.loss(logp, batch, state)


# --------------------------------------------------------------------------
# R^2VPO


def test_r2vpo_dual_ascent_and_exact_variance_gradient():
  delta, eta = 0.01, 5.0
  algo = rljax.Algorithm(S.r2vpo(delta=delta, eta=eta), aggregate.token_mean)
  batch, logp = _prepared(3, scale=0.2)
  mask = np.asarray(batch.loss_mask(), np.float64)
  m = mask > 0
  r = np.exp(np.float64(logp) - batch.old_logp_PGT)
  var = r[m].var()
  assert var > delta
  state = _observed(algo, batch, logp)
  # lambda_1 = max(0, 0 + eta (Var - delta)); a second step adds again.
  np.testing.assert_allclose(state.lam, eta * (var - delta), rtol=1e-4)
  np.testing.assert_allclose(state.variance, var, rtol=1e-4)
  state2 = _observed(algo, batch, logp, state=state)
  np.testing.assert_allclose(state2.lam, 2 * eta * (var - delta), rtol=1e-4)
  # A constraint met drives lambda down to 0, never below.
  slack = rljax.Algorithm(S.r2vpo(delta=1.0, eta=eta), aggregate.token_mean)
  np.testing.assert_allclose(
    _observed(slack, batch, logp, state=state).lam, 0.0
  )
  whole, grad = _check_micro_batching(algo, batch, logp, state)
  # Value and gradient: token mean of -r A, plus lambda (Var_B[r] - delta)
  # with Var_B over the whole minibatch (float64, by hand).
  adv = np.asarray(batch.advantages_PGT, np.float64)
  lam, n = float(state.lam), mask.sum()
  value = (mask * -r * adv).sum() / n + lam * (var - delta)
  grad_ref = mask * (-r * adv) / n + lam * mask * 2 * r * (r - r[m].mean()) / n
  np.testing.assert_allclose(whole.value, value, rtol=1e-5)
  np.testing.assert_allclose(grad, grad_ref, rtol=1e-4, atol=1e-7)


# --------------------------------------------------------------------------
# Per-token-bound stages


def test_dcpo_dispo_llds_stages_match_their_losses_and_split_exactly():
  batch, logp = _prepared(4)
  mask = batch.loss_mask()
  args = (logp, batch.old_logp_PGT, batch.advantages_PGT, mask)
  cases = [
    (S.dcpo_clip(), L.dcpo_clip(*args).loss),
    (S.dispo(mode="mask", eps_low_neg=0.1), L.dispo(
      *args, mode="mask", eps_low_neg=0.1).loss),
    (S.dispo(correct_by="reward", eps_high_pos=0.4), L.dispo(
      *args, eps_high_pos=0.4,
      correct_BT=np.float32(batch.rewards_PG > 0)[..., None]).loss),
  ]  # fmt: skip
  for stage, ref in cases:
    algo = rljax.Algorithm(stage, aggregate.seq_mean_token_sum)
    whole, _ = _check_micro_batching(algo, batch, logp, algo.init())
    np.testing.assert_allclose(
      whole.value, aggregate.seq_mean_token_sum(ref, mask).value, rtol=1e-5
    )
  # LLDS: a penalty on top of a policy term.
  algo = rljax.Algorithm(
    rljax.chain(S.dcpo_clip(), S.llds(coef=0.5)), aggregate.token_mean
  )
  whole, _ = _check_micro_batching(algo, batch, logp, algo.init())
  ref = L.dcpo_clip(*args).loss + 0.5 * L.llds(*args)
  np.testing.assert_allclose(
    whole.value, aggregate.token_mean(ref, mask).value, rtol=1e-5
  )


def test_etr_and_hapo_stages_read_their_batch_stage_outputs():
  batch, logp = _prepared(
    5, transforms.etr_bounds(eps_low=0.1), transforms.hapo_entropy_scores()
  )
  mask = batch.loss_mask()
  args = (logp, batch.old_logp_PGT, batch.advantages_PGT, mask)
  low = batch.extra["etr_eps_low_PG"][..., None]
  high = batch.extra["etr_eps_high_PG"][..., None]
  ref = L.ppo_clip_bounds(*args, ratio_low=1 - low, ratio_high=1 + high).loss
  algo = rljax.Algorithm(S.etr(), aggregate.token_mean)
  whole, _ = _check_micro_batching(algo, batch, logp, algo.init())
  np.testing.assert_allclose(
    whole.value, aggregate.token_mean(ref, mask).value, rtol=1e-5
  )
  scores = batch.extra["hapo_entropy_scores_PGT"]
  ref = L.hapo_het(*args, entropy_scores_BT=scores).loss
  algo = rljax.Algorithm(S.hapo_het(), aggregate.token_mean)
  whole, _ = _check_micro_batching(algo, batch, logp, algo.init())
  np.testing.assert_allclose(
    whole.value, aggregate.token_mean(ref, mask).value, rtol=1e-5
  )
  bare, _ = _prepared(5)
  with pytest.raises(ValueError, match="etr_eps_low_PG"):
    rljax.Algorithm(S.etr(), aggregate.token_mean).loss(logp, bare, ())


def test_bad_stage_arguments_raise():
  with pytest.raises(ValueError, match="contribution"):
    S.bapo(contribution="both")
  with pytest.raises(ValueError, match="low_start"):
    S.bapo(low_start=1.1, low_max=1.2)
  with pytest.raises(ValueError, match="correct_by"):
    S.dispo(correct_by="sign")
  with pytest.raises(ValueError, match="mode"):
    S.dispo(mode="hard")
  with pytest.raises(ValueError, match="preserve"):
    S.aepo(preserve="mid")
  with pytest.raises(ValueError, match="eta"):
    S.r2vpo(eta=-1.0)
  with pytest.raises(ValueError, match="coef"):
    S.llds(coef=-1.0)


# --------------------------------------------------------------------------
# Presets


@pytest.mark.parametrize("name", sorted(presets.PRESETS))
def test_presets_prepare_and_loss_are_finite_under_jit(name):
  kwargs = {"num_prompts": 8} if name == "dcpo" else {}
  algo = presets.PRESETS[name](**kwargs)
  batch = testing.random_batch(9)
  state = algo.init()
  batch, state = jax.jit(algo.prepare)(batch, state)
  logp = testing.perturbed_logp(batch)
  if algo.measures:
    state = jax.jit(algo.observe)(
      state, jax.jit(algo.measure)(logp, batch, state)
    )

  @jax.jit
  def value_and_grad(lp):
    return jax.value_and_grad(lambda x: algo.loss(x, batch, state)[0].value)(lp)

  value, grad = value_and_grad(logp)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  assert np.any(np.asarray(grad) != 0)


def test_dcpo_preset_keeps_per_prompt_statistics_across_steps():
  algo = presets.dcpo(num_prompts=6)
  state = algo.init()
  batch = testing.random_batch(10)
  for _ in range(3):
    _, state = algo.prepare(batch, state)
  table = state[0].table
  assert table.seen.tolist() == [3, 3, 3, 3, 0, 0]
  with pytest.raises(ValueError, match="prompt_ids_P"):
    algo.prepare(batch._replace(prompt_ids_P=None), algo.init())
