"""ReMix: the loss against a numpy reference (values and gradients, a
hand-worked case), the replay buffer's state machine by hand, replayed
members sampled by the engine, and one trainer step."""

import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import aggregate
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax import transforms
from rljax._src.base import Batch
from rljax.training import Trainer
from rljax.training import _rollout

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "remix.py"
ALPHABET = "0123456789+-=ab"


# --------------------------------------------------------------------------
# numpy reference of the loss


def _np_k3(logp, other):
  """k3 of `losses.kl_k3`: e^x - x - 1, x = other - logp (no clamp hit)."""
  x = other - logp
  return np.exp(x) - x - 1.0


def _np_remix(
  logp, old, rollout, ref, adv, mask, replayed, eps, coef, lam
) -> float:
  """Token mean of the ReMix per-token loss, in float64."""
  mu = np.where(replayed[..., None], rollout, old)
  r = np.exp(logp - mu)
  pg = np.maximum(-adv * r, -adv * np.clip(r, 1 - eps, 1 + eps))
  kl = lam * _np_k3(logp, ref) + (1 - lam) * _np_k3(logp, old)
  per_token = (pg + coef * kl) * mask
  return per_token.sum() / mask.sum()


def _np_grad(f, x, h=1e-6):
  g = np.zeros_like(x)
  for i in np.ndindex(x.shape):
    e = np.zeros_like(x)
    e[i] = h
    g[i] = (f(x + e) - f(x - e)) / (2 * h)
  return g


def _random_inputs(seed=0, shape=(2, 3, 4)):
  rng = np.random.default_rng(seed)
  logp = np.log(rng.uniform(0.2, 0.9, shape))
  old = logp + rng.normal(0, 0.1, shape)
  rollout = logp + rng.normal(0, 0.4, shape)
  ref = logp + rng.normal(0, 0.2, shape)
  adv = rng.normal(0, 1, shape)
  mask = (rng.uniform(size=shape) > 0.2).astype(np.float64)
  replayed = rng.uniform(size=shape[:2]) > 0.5
  return logp, old, rollout, ref, adv, mask, replayed


def _jax_loss(logp, old, rollout, ref, adv, mask, replayed, **kw):
  out, penalty = transforms.remix_loss(
    logp, old, rollout, ref, adv, mask, replayed, **kw
  )
  return aggregate.token_mean(out.loss + penalty, jnp.asarray(mask)).value


@pytest.mark.parametrize("lam", [0.0, 0.3, 1.0])
def test_remix_loss_matches_numpy(lam):
  logp, old, rollout, ref, adv, mask, replayed = _random_inputs()
  kw = dict(eps_low=0.2, eps_high=0.2, kl_coef=0.1, lam=lam)
  f = jax.jit(
    lambda x: _jax_loss(x, old, rollout, ref, adv, mask, replayed, **kw)
  )
  want = _np_remix(logp, old, rollout, ref, adv, mask, replayed, 0.2, 0.1, lam)
  np.testing.assert_allclose(f(jnp.float32(logp)), want, rtol=1e-5)
  grad = jax.jit(jax.grad(f))(jnp.asarray(logp, jnp.float32))
  want_grad = _np_grad(
    lambda x: _np_remix(
      x, old, rollout, ref, adv, mask, replayed, 0.2, 0.1, lam
    ),
    logp,
  )
  np.testing.assert_allclose(grad, want_grad, atol=2e-5)


def test_remix_loss_hand_worked():
  # One token per sample, A = 1, pi = 0.5, base = 0.5; eps 0.2, coef 0.1,
  # lam 0.5.
  # Sample 0 (fresh): mu = old = 0.5, r = 1, L = -1, dL/dlogp = -r = -1; KL
  #   to base and precedent both 0.
  # Sample 1 (replayed): mu = 0.45, r = 0.5 / 0.45 = 1.11111 (inside the
  #   clip): L_pi = -1.11111, dL_pi/dlogp = -1.11111. Its precedent is
  #   old = 0.4: x = log(0.4 / 0.5) = log 0.8, k3 = 0.8 - log 0.8 - 1 =
  #   0.0231436, dk3/dlogp = 1 - 0.8 = 0.2; base KL 0. Penalty 0.1 * 0.5 *
  #   0.0231436 = 0.00115718, its gradient 0.1 * 0.5 * 0.2 = 0.01.
  # (Against old instead of mu, r would be 1.25, clipped: L = -1.2, grad 0.)
  # Token mean: (-1 + -1.11111 + 0.00115718) / 2 = -1.05497696.
  logp = np.log([[[0.5], [0.5]]])
  old = np.log([[[0.5], [0.4]]])
  rollout = np.log([[[0.5], [0.45]]])
  ones = np.ones((1, 2, 1))
  replayed = np.array([[False, True]])
  kw = dict(kl_coef=0.1, lam=0.5)
  out, penalty = transforms.remix_loss(
    logp, old, rollout, logp, ones, ones, replayed, **kw
  )
  np.testing.assert_allclose(out.loss[0, :, 0], [-1.0, -1.1111111], rtol=1e-6)
  np.testing.assert_allclose(penalty[0, :, 0], [0.0, 0.00115718], atol=1e-7)
  f = lambda x: _jax_loss(x, old, rollout, logp, ones, ones, replayed, **kw)  # noqa: E731
  np.testing.assert_allclose(f(logp), -1.05497696, rtol=1e-6)
  grad = jax.grad(f)(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(
    grad[0, :, 0], [-1.0 / 2, (-1.1111111 + 0.01) / 2], rtol=1e-5
  )


def test_behaviour_and_bad_input():
  old, roll = np.zeros((1, 2, 2)), np.ones((1, 2, 2))
  mu = transforms.remix_behaviour_logp(old, roll, np.array([[0, 1]]))
  np.testing.assert_array_equal(mu, [[[0, 0], [1, 1]]])
  with pytest.raises(ValueError, match="replayed_PG"):
    transforms.remix_behaviour_logp(old, roll, np.zeros((2, 1)))
  with pytest.raises(ValueError, match="lam"):
    transforms.remix(lam=1.5)
  with pytest.raises(ValueError, match="reincarnate_at"):
    transforms.remix(reincarnate_at=-1)


def _batch(seed=0):
  logp, old, rollout, ref, adv, mask, replayed = _random_inputs(seed)
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  stream = np.where(replayed, rollouts.REPLAYED, rollouts.PLAIN)
  batch = Batch(
    mask_PGT=f32(mask),
    advantages_PGT=f32(adv),
    old_logp_PGT=f32(old),
    rollout_logp_PGT=f32(rollout),
    ref_logp_PGT=f32(ref),
  ).with_extra(stream_PG=jnp.asarray(stream, jnp.int32))
  return batch, f32(logp), (logp, old, rollout, ref, adv, mask, replayed)


def test_stage_reincarnates_by_step():
  algo = rljax.Algorithm(
    transforms.remix(kl_coef=0.1, lam=0.3, reincarnate_at=2),
    aggregate.token_mean,
  )
  batch, logp, arrays = _batch()
  state = algo.init()
  loss = jax.jit(lambda b, s: algo.loss(logp, b, s)[0].value)
  for t in range(4):  # batches 0, 1 mix the KLs, 2 and 3 use the base only
    prepared, state = algo.prepare(batch, state, key=jax.random.key(t))
    lam = 0.3 if t < 2 else 1.0
    want = _np_remix(*arrays, 0.2, 0.1, lam)
    np.testing.assert_allclose(loss(prepared, state), want, rtol=1e-5)


# --------------------------------------------------------------------------
# the strategy's state machine


def _scores(tokens, logps, streams, rewards=None):
  """Scores of a [P, G] batch whose completions are `tokens` lists."""
  p, g = len(tokens), len(tokens[0])
  t = max(len(x) for row in tokens for x in row)
  tok = np.zeros((p, g, t), np.int32)
  mask = np.zeros((p, g, t), np.int32)
  lp = np.zeros((p, g, t), np.float32)
  for i in range(p):
    for j in range(g):
      n = len(tokens[i][j])
      tok[i, j, :n], mask[i, j, :n], lp[i, j, :n] = tokens[i][j], 1, logps[i][j]
  zeros = np.zeros((p, g, 3), np.int32)
  r = sampling.Rollout(
    prompt_tokens_PGS=zeros,
    prompt_mask_PGS=zeros,
    tokens_PGT=tok,
    mask_PGT=mask,
    logp_PGT=lp,
    truncated_PG=np.zeros((p, g), bool),
    group_ids_PG=np.zeros((p, g), np.int32),
    full_logp_PGT=lp - 0.5 * mask,
    sample_mask_PG=np.ones((p, g), np.int32),
  )
  members = [[rollouts.Member(stream=s) for s in row] for row in streams]
  return rollouts.Scores(
    rewards=np.zeros((p, g), np.float32) if rewards is None else rewards,
    correct=np.zeros((p, g), bool),
    valid=np.ones((p, g), bool),
    members=members,
    completions=[[""] * g for _ in range(p)],
    surprise=np.zeros((p, g)),
    rollout=r,
  )


def _group(prompt_id, n=3):
  return rollouts.Group({}, "1+2=", prompt_id, n)


def test_buffer_keeps_the_last_window_steps():
  s = rollouts.MixPolicyReplay(window=2, num_replayed=2)
  state = s.init()
  assert [m.stream for m in s.plan(_group(7), 0, state)] == [0, 0, 0]
  groups = [_group(7)]
  # step 0: three fresh samples of prompt 7
  sc = _scores(
    [[[3, 1], [4, 5, 1], [6, 1]]],
    [[[-1, -2], [-1, -1, -1], [-3, 0]]],
    [[0, 0, 0]],
  )
  state = s.update(groups, sc, 0, state)
  assert state["buffers"]["7"][1][:3] == [0, [4, 5, 1], [-1.0, -1.0, -1.0]]
  assert state["buffers"]["7"][1][3] == [-1.5, -1.5, -1.5]  # full logp
  assert len(state["buffers"]["7"]) == 3
  # step 1: the last 2 of 3 samples are replayed, from the step-0 entries,
  # drawn by the generator seeded (0, 1, 7)
  plan = s.plan(groups[0], 1, state)
  assert [m.stream for m in plan] == [0, rollouts.REPLAYED, rollouts.REPLAYED]
  rng = np.random.default_rng([0, 1, 7])
  chosen = sorted(rng.choice(3, size=2, replace=False))
  stored = state["buffers"]["7"]
  for m, i in zip(plan[1:], chosen):
    assert m.prefix == tuple(stored[i][1])
    assert m.prefix_logp == tuple(stored[i][2])
  assert plan == s.plan(groups[0], 1, state)  # deterministic
  # step 1's update stores its fresh sample only (replayed ones are not
  # stored again)
  sc = _scores(
    [[[9, 1], [4, 5, 1], [6, 1]]],
    [[[-0.5, -0.5], [-1, -1, -1], [-3, 0]]],
    [[0, 6, 6]],
  )
  state = s.update(groups, sc, 1, state)
  assert [e[0] for e in state["buffers"]["7"]] == [0, 0, 0, 1]
  # step 2 drops step-0 entries (window 2 keeps steps 1 and 2): only
  # [9, 1] is left before step 2's samples
  sc = _scores([[[8, 1], [8, 1], [8, 1]]], [[[0, 0]] * 3], [[0, 6, 6]])
  state = s.update(groups, sc, 2, state)
  assert [e[0] for e in state["buffers"]["7"]] == [1, 2]
  assert state["buffers"]["7"][0][1] == [9, 1]
  # At step 3 the entries of steps 1 and 2 are replayable: both replayed.
  plan = s.plan(groups[0], 3, state)
  assert [m.stream for m in plan] == [0, 6, 6]
  assert {plan[1].prefix, plan[2].prefix} == {(9, 1), (8, 1)}
  # Other prompts have nothing to replay; reincarnation stops replay.
  assert [m.stream for m in s.plan(_group(8), 3, state)] == [0, 0, 0]
  late = rollouts.MixPolicyReplay(window=2, num_replayed=2, reincarnate_at=3)
  assert [m.stream for m in late.plan(groups[0], 3, state)] == [0, 0, 0]
  assert [m.stream for m in late.plan(groups[0], 2, state)] == [0, 0, 6]


def test_strategy_bad_input():
  with pytest.raises(ValueError, match="window"):
    rollouts.MixPolicyReplay(window=0)
  with pytest.raises(ValueError, match="num_replayed"):
    rollouts.MixPolicyReplay(num_replayed=0)
  s = rollouts.MixPolicyReplay()
  sc = _scores([[[1]]], [[[0.0]]], [[0]])._replace(rollout=None)
  with pytest.raises(ValueError, match="Scores.rollout"):
    s.update([_group(0, 1)], sc, 0, s.init())


# --------------------------------------------------------------------------
# replayed members through the engine, and the trainer


def _sample(model, tokenizer, members, prompts, key):
  engine = sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=4,
    max_length=24,
    stop_ids=tokenizer.stop_ids,
  )
  return rollouts.sample_members(
    engine,
    model,
    lambda texts: _rollout.encode_prompts(tokenizer, texts, 8),
    members,
    prompts,
    key=jax.random.key(key),
    max_new_tokens=5,
    width=6,
    temperature=1.0,
    encode_completion=lambda t: tokenizer.encode(t, add_bos=False) + [1],
  )


def test_replayed_members_are_the_stored_samples(model, tokenizer):
  s = rollouts.MixPolicyReplay(window=1, num_replayed=2)
  groups = [_group(0, 3), _group(1, 3)]
  prompts = ["1+2=", "3+4="]
  first = _sample(model, tokenizer, [[rollouts.Member()] * 3] * 2, prompts, 0)
  sc = _scores([[[1]] * 3] * 2, [[[0.0]] * 3] * 2, [[0] * 3] * 2)
  state = s.update(groups, sc._replace(rollout=first), 0, state=s.init())
  plans = [s.plan(g, 1, state) for g in groups]
  out = _sample(model, tokenizer, plans, prompts, 1)
  for p in range(2):
    for g in (1, 2):
      ids, logp = plans[p][g].prefix, plans[p][g].prefix_logp
      n = len(ids)
      np.testing.assert_array_equal(out.tokens_PGT[p, g, :n], ids)
      np.testing.assert_array_equal(out.mask_PGT[p, g].sum(), n)
      np.testing.assert_allclose(out.logp_PGT[p, g, :n], logp, atol=1e-6)
      # ...and they are one of step 0's samples of that prompt, whole.
      assert any(
        np.array_equal(first.tokens_PGT[p, j], out.tokens_PGT[p, g])
        and np.allclose(first.logp_PGT[p, j], out.logp_PGT[p, g])
        for j in range(3)
      )


@pytest.mark.slow
def test_trainer_replays_past_samples(tmp_path):
  config = testing.tiny_run_config(CONFIG, tmp_path, "train.steps=2")
  # 8 training prompts, 8 per step: step 1 poses step 0's prompts again,
  # so their groups replay step 0's samples.
  task = dataclasses.replace(
    config.task, kwargs={**config.task.kwargs, "train_size": 8}
  )
  trainer = Trainer(dataclasses.replace(config, task=task))
  trainer.step(0)
  assert not np.any(trainer._last.streams_PG == rollouts.REPLAYED)
  metrics = trainer.step(1)
  stream = np.asarray(trainer._last.streams_PG)
  assert np.any(stream == rollouts.REPLAYED)
  assert np.isfinite(metrics["loss"])
