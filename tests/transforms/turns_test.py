"""Turn-level stages on agent-episode batches (rljax.transforms._turns) and
the agent presets: rewards per turn, advantages on action tokens only,
SeeUPO's turn schedule and ratio correction, LOOP, and issue 14's masks
check (observation tokens get no gradient and no KL or entropy term)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import advantages as A
from rljax import algorithms
from rljax import losses
from rljax import objectives
from rljax import testing
from rljax import transforms as T

# The hand-built episode batch (P = 1, G = 2, T = 8, N = 3):
#   sample 0: a0 a0 o0 o0 a1 a1 -  -   (2 actions)
#   sample 1: a0 o0 a1 a1 a1 o1 a2 -   (3 actions)
LOSS = np.array(
  [[[1, 1, 0, 0, 1, 1, 0, 0], [1, 0, 1, 1, 1, 0, 1, 0]]], np.float32
)
IDS = np.array(
  [[[0, 0, 0, 0, 1, 1, -1, -1], [0, 0, 1, 1, 1, 1, 2, -1]]], np.int32
)
TURNS = np.array([[2, 3]], np.int32)
TURN_R = np.array([[[0.0, 1.0, 0.0], [0.5, 0.0, 0.0]]], np.float32)
STATES = np.array([[[0, 1, -1], [0, 2, 3]]], np.int32)
OBS = (IDS >= 0) & (LOSS == 0)  # observation tokens


def hand_batch(rewards=(1.0, 2.0), **fields):
  completion = (IDS >= 0).astype(np.float32)
  shape = LOSS.shape
  rng = np.random.default_rng(0)
  old = -rng.gamma(2.0, 0.5, size=shape).astype(np.float32)
  batch = rljax.Batch(
    mask_PGT=jnp.asarray(completion * LOSS),  # what the Trainer passes on
    rewards_PG=None if rewards is None else jnp.asarray([rewards], jnp.float32),
    old_logp_PGT=jnp.asarray(old),
    ref_logp_PGT=jnp.asarray(
      old + rng.normal(0, 0.2, shape).astype(np.float32)
    ),
    old_values_PGT=jnp.asarray(rng.uniform(size=shape).astype(np.float32)),
    tokens_PGT=jnp.asarray(rng.integers(0, 5, shape).astype(np.int32)),
    **fields,
  )
  return batch.with_extra(
    loss_mask_PGT=LOSS,
    turn_ids_PGT=IDS,
    turns_PG=TURNS,
    turn_rewards_PG=TURN_R,
    state_ids_PG=STATES,
  )


def agent_batch(seed, prompts=3, samples=4, tokens=16, turns=4, states=2):
  """Random episodes: runs of action then observation tokens."""
  rng = np.random.default_rng(seed)
  shape = (prompts, samples, tokens)
  ids = np.full(shape, -1, np.int32)
  loss = np.zeros(shape, np.float32)
  taken = np.zeros(shape[:2], np.int32)
  for row in np.ndindex(shape[:2]):
    pos, k = 0, 0
    end = rng.integers(3, tokens + 1)
    while pos < end and k < turns:
      act, obs = rng.integers(1, 4), rng.integers(0, 3)
      ids[row][pos : min(pos + act + obs, end)] = k
      loss[row][pos : min(pos + act, end)] = 1
      pos, k = pos + act + obs, k + 1
    taken[row] = k
  alive = np.arange(turns) < taken[..., None]
  turn_r = np.where(alive, rng.normal(size=(*shape[:2], turns)), 0)
  sid = np.where(alive, rng.integers(0, states, (*shape[:2], turns)), -1)
  base = testing.random_batch(
    seed, prompts=prompts, samples=samples, tokens=tokens
  )
  batch = base._replace(
    mask_PGT=jnp.asarray((ids >= 0) * loss, jnp.float32),
    rewards_PG=jnp.asarray(rng.integers(0, 2, shape[:2]), jnp.float32),
  )
  return batch.with_extra(
    loss_mask_PGT=loss,
    turn_ids_PGT=ids,
    turns_PG=taken,
    turn_rewards_PG=turn_r.astype(np.float32),
    state_ids_PG=sid.astype(np.int32),
  )


def prepared(transform, batch):
  out, _ = jax.jit(transform.prepare)(batch, transform.init())
  return out


# ------------------------------------------------------------------ rewards


def test_turn_rewards_credit_the_task_reward_remainder_to_the_last_action():
  # Sample 0: turn rewards [0, 1, 0] sum to its task reward 1: unchanged.
  # Sample 1: turn rewards sum to .5, task reward 2: the remaining 1.5 goes
  # to its last action (turn 2): [.5, 0, 1.5].
  got = T.turn_rewards(hand_batch())
  np.testing.assert_allclose(got, [[[0, 1, 0], [0.5, 0, 1.5]]])
  np.testing.assert_allclose(T.episode_returns(hand_batch()), [[1.0, 2.0]])
  # Without a task reward the turn rewards are the returns' parts.
  np.testing.assert_allclose(T.turn_rewards(hand_batch(None)), TURN_R)
  # Per-token rewards (KL in the reward, -.1 per action token) add to their
  # turn: sample 0 turns hold 2, 2, 0 action tokens; sample 1: 1, 3, 1.
  kl = jnp.asarray(-0.1 * LOSS)
  got = T.turn_rewards(hand_batch(token_rewards_PGT=kl))
  want = [[[-0.2, 0.8, 0.0], [0.4, -0.3, 1.4]]]
  np.testing.assert_allclose(got, want, rtol=1e-6)


def test_episode_level_grpo_composes_with_the_existing_estimators():
  # With a task reward the episode's return is that reward:
  # episode_advantages(grpo) is group_advantages(grpo), on actions only.
  batch = agent_batch(1)
  got = prepared(T.episode_advantages(A.grpo), batch).advantages_PGT
  want = prepared(T.group_advantages(A.grpo), batch).advantages_PGT
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  loss_mask = np.asarray(batch.extra["loss_mask_PGT"])
  assert np.all(np.asarray(got)[loss_mask == 0] == 0)
  assert np.any(np.asarray(got) != 0)
  # Without one, the return is the sum of the turn rewards.
  bare = batch._replace(rewards_PG=None)
  got = prepared(T.episode_advantages(A.rloo), bare).advantages_PGT
  ret = np.asarray(batch.extra["turn_rewards_PG"]).sum(-1)
  want = np.asarray(A.rloo(ret))[..., None] * np.asarray(batch.mask_PGT)
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_single_turn_episodes_reduce_to_grpo():
  # The one-step case: every completion token is action 0, no turn reward
  # (the task reward is the last action's), no states. Turn-level GRPO and
  # GiGPO are then GRPO, SALT over distinct actions too.
  batch = testing.random_batch(5)
  mask = np.asarray(batch.mask_PGT)
  pg = mask.shape[:2]
  batch = batch.with_extra(
    turn_ids_PGT=np.where(mask > 0, 0, -1).astype(np.int32),
    turns_PG=np.ones(pg, np.int32),
    turn_rewards_PG=np.zeros((*pg, 1), np.float32),
    state_ids_PG=np.full((*pg, 1), -1, np.int32),
  )
  want = prepared(T.group_advantages(A.grpo), batch).advantages_PGT
  for stage in [
    T.turn_advantages(),
    T.gigpo_advantages(),
    T.episode_advantages(A.grpo),
  ]:
    got = prepared(stage, batch).advantages_PGT
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


# ------------------------------------------------- estimators on the tokens


def _per_turn_reference(name, batch):
  r = T.turn_rewards(batch)
  turns = batch.extra["turns_PG"]
  sid = batch.extra["state_ids_PG"]
  if name == "turn":
    return A.turn_grpo(A.turn_returns(r, turns, gamma=0.9), turns)
  if name == "gigpo":
    return A.gigpo(r, sid, turns)
  if name == "hgpo":
    return A.hgpo(r, sid, turns)
  if name == "seeupo":
    return A.seeupo(jnp.sum(r, -1), turns, r.shape[-1])
  traj = A.rloo(jnp.sum(r, -1))
  ids = batch.extra["turn_ids_PGT"]
  actions = A.action_hashes(batch.tokens_PGT, ids, batch.mask_PGT, r.shape[-1])
  return A.salt(traj, sid, actions, turns)


STAGES = {
  "turn": T.turn_advantages(gamma=0.9),
  "gigpo": T.gigpo_advantages(),
  "hgpo": T.hgpo_advantages(),
  "seeupo": T.seeupo_advantages(),
  "salt": T.salt_advantages(A.rloo),
}


@pytest.mark.parametrize("name", sorted(STAGES))
def test_stage_puts_each_turns_advantage_on_its_action_tokens(name):
  batch = agent_batch(2)
  got = np.asarray(prepared(STAGES[name], batch).advantages_PGT)
  per_turn = _per_turn_reference(name, batch)
  want = A.turns_to_tokens(per_turn, batch.extra["turn_ids_PGT"])
  want = np.asarray(want) * np.asarray(batch.extra["loss_mask_PGT"])
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  assert np.all(got[np.asarray(batch.extra["loss_mask_PGT"]) == 0] == 0)
  assert np.any(got != 0)


def test_gigpo_stage_on_the_hand_batch():
  # Turn rewards [0, 1, 0] / [.5, 0, 1.5], gamma .5: R_t = [.5, 1] and
  # [.875, .75, 1.5]; R = [1, 2] -> A^E (std) = -+.70711. State 0 holds
  # both turn-0 steps: R_t {.5, .875}, mean .6875, std .26517 -> -+.70711.
  # The other states are alone: A^S = 0.
  out = prepared(T.gigpo_advantages(gamma=0.5), hand_batch())
  e = 1 / np.sqrt(2)
  per_turn = np.array([[[-2 * e, -e, 0], [2 * e, e, e]]])
  want = np.take_along_axis(per_turn, np.maximum(IDS, 0), -1) * LOSS
  np.testing.assert_allclose(out.advantages_PGT, want, rtol=1e-5, atol=1e-6)


def test_poad_stage_rewards_last_action_tokens_and_whitens():
  batch = hand_batch(token_rewards_PGT=jnp.asarray(-0.1 * LOSS))
  out = prepared(T.poad_advantages(gamma=0.9, lam=0.8), batch)
  # Rewards per turn without the KL: [0, 1, 0] and [.5, 0, 1.5], on the
  # last action token of each turn, plus the KL on every action token.
  r = np.zeros(LOSS.shape, np.float32)
  r[0, 0, 5] = 1.0
  r[0, 1, 0], r[0, 1, 6] = 0.5, 1.5
  r -= 0.1 * LOSS
  adv, ret = A.action_gae(
    r, batch.old_values_PGT, LOSS, IDS, gamma=0.9, lam=0.8
  )
  np.testing.assert_allclose(out.returns_PGT, ret, rtol=1e-5)
  np.testing.assert_allclose(
    out.advantages_PGT, A.whiten(adv, LOSS), rtol=1e-5, atol=1e-6
  )
  assert np.all(np.asarray(out.advantages_PGT)[OBS] == 0)


def test_drop_small_advantages_leaves_out_samples_without_signal():
  batch = hand_batch()._replace(
    advantages_PGT=jnp.asarray(LOSS * np.array([0.005, -0.3])[None, :, None])
  )
  out = prepared(T.drop_small_advantages(threshold=0.01), batch)
  np.testing.assert_array_equal(out.sample_mask_PG, [[0.0, 1.0]])


def test_missing_side_data_is_a_clear_error():
  batch = rljax.Batch(mask_PGT=jnp.ones((1, 2, 3)), rewards_PG=jnp.ones((1, 2)))
  with pytest.raises(ValueError, match=r"gigpo_advantages needs Batch\.extra"):
    T.gigpo_advantages().prepare(batch, ())
  bad = hand_batch().with_extra(state_ids_PG=STATES.astype(np.float32))
  with pytest.raises(ValueError, match="state_ids_PGN must hold integer"):
    T.hgpo_advantages().prepare(bad, ())
  with pytest.raises(ValueError, match=r"tokens_PGT"):
    T.salt_advantages().prepare(hand_batch()._replace(tokens_PGT=None), ())
  with pytest.raises(ValueError, match="old_values_PGT"):
    T.poad_advantages().prepare(hand_batch()._replace(old_values_PGT=None), ())


# ------------------------------------------------------------------- SeeUPO


def test_seeupo_schedule_runs_turns_backwards_one_epoch_each():
  # N = 3 turns, 2 minibatches per epoch: steps 1-2 train turn 2, 3-4 turn
  # 1, 5-6 turn 0, then turn 2 again.
  steps = jnp.arange(1, 8)
  got = jax.vmap(lambda s: T.seeupo_turn(s, 3, 2))(steps)
  np.testing.assert_array_equal(got, [2, 2, 1, 1, 0, 0, 2])


def _seeupo_algo(loss_fn, kl_coef=0.0, **hyper):
  stages = [T.seeupo_advantages()]
  if kl_coef:
    stages.append(objectives.kl_penalty(losses.kl_k3, coef=kl_coef))
  stages.append(T.seeupo_policy(loss_fn, **hyper))
  return rljax.Algorithm(
    rljax.chain(*stages), rljax.aggregate.seq_mean_token_mean
  )


def _at_step(algo, batch, step):
  batch, state = algo.prepare(batch, algo.init())
  for _ in range(step):
    state = algo.observe(state, {})
  return batch, state


@pytest.mark.parametrize("step,turn", [(1, 2), (2, 1), (3, 0)])
def test_seeupo_trains_one_turns_action_tokens_per_phase(step, turn):
  algo = _seeupo_algo(losses.gspo, kl_coef=0.1, eps_low=0.2, eps_high=0.2)
  batch, state = _at_step(algo, hand_batch(), step)
  logp = testing.perturbed_logp(batch)
  grad = jax.jit(jax.grad(lambda l: algo.loss(l, batch, state)[0].value))(logp)
  trained = (IDS == turn) & (LOSS > 0)
  assert np.all(np.asarray(grad)[~trained] == 0)
  assert np.all(np.asarray(grad)[trained] != 0)


def test_seeupo_correction_and_per_turn_normalisation_match_numpy():
  """REINFORCE inside the stage: the gradient at turn k's tokens is
  -A M / (n_k E), M the clipped product of the later turns' ratios, n_k the
  row's turn-k action tokens, E the number of sequences."""
  batch = hand_batch()
  old = np.asarray(batch.old_logp_PGT)
  shift = np.zeros(LOSS.shape, np.float32)
  shift[0, 1, 6] = 0.25  # turn 2 of sample 1: ratio e^.25 = 1.284 -> 1.2
  shift[0, 1, 2:5] = -0.05  # turn 1 of sample 1: e^-.05 = .95123
  shift[0, 0, 4:6] = 0.1  # turn 1 of sample 0: e^.1 = 1.10517
  logp = jnp.asarray(old + shift)
  algo = _seeupo_algo(losses.reinforce, ratio_clip_low=0.2, ratio_clip_high=0.2)
  adv = np.asarray(prepared(T.seeupo_advantages(), batch).advantages_PGT)
  e = 2.0

  def grad_at(step):
    b, state = _at_step(algo, batch, step)
    return np.asarray(
      jax.jit(jax.grad(lambda l: algo.loss(l, b, state)[0].value))(logp)
    )

  # Phase of turn 0 (step 3): sample 0: M = s_1 = 1.10517 (no turn 2);
  # sample 1: M = clip(clip(1.2) * .95123) = 1.14148. Turn-0 action
  # tokens: 2 and 1.
  # Phase of turn 1 (step 2): sample 0: M = 1; sample 1: M = 1.2. Turn-1
  # action tokens: 2 and 3.
  cases = {
    3: (0, [np.exp(0.1), 1.2 * np.exp(-0.05)], [2.0, 1.0]),
    2: (1, [1.0, 1.2], [2.0, 3.0]),
  }
  for step, (turn, m, n_k) in cases.items():
    grad = grad_at(step)
    for g in range(2):
      at = (IDS[0, g] == turn) & (LOSS[0, g] > 0)
      np.testing.assert_allclose(
        grad[0, g][at], -adv[0, g][at] * m[g] / (n_k[g] * e), rtol=1e-5
      )
      assert np.all(grad[0, g][~at] == 0)
  # Phase of turn 2 (step 1): one episode reached it, so it has no
  # baseline (advantage 0) and the phase trains nothing.
  assert np.all(grad_at(1) == 0)


def test_seeupo_penalties_only_see_the_trained_turn():
  # With the policy term off (zero advantages), the loss is the KL of the
  # trained turn's tokens, averaged per row over those tokens.
  algo = _seeupo_algo(losses.gspo, kl_coef=1.0, eps_low=0.2, eps_high=0.2)
  batch = hand_batch()._replace(rewards_PG=jnp.zeros((1, 2)))
  batch = batch.with_extra(turn_rewards_PG=np.zeros_like(TURN_R))
  batch, state = _at_step(algo, batch, 2)  # turn 1
  logp = testing.perturbed_logp(batch)
  value = algo.loss(logp, batch, state)[0].value
  kl = np.asarray(losses.kl_k3(logp, batch.ref_logp_PGT))
  rows = [
    kl[0, g][(IDS[0, g] == 1) & (LOSS[0, g] > 0)].mean() for g in range(2)
  ]
  np.testing.assert_allclose(value, np.mean(rows), rtol=1e-5)


# ------------------------------------------------------------------- LOOP


def test_loop_matches_the_official_per_token_objective():
  """LOOP (apple/ml-loop): LOO advantage, rollouts with |A| < .01 dropped,
  min(r A, clip(r, 1/1.1, 1.1) A) per action token, mean per rollout, mean
  over the kept rollouts."""
  batch = agent_batch(3, prompts=2, samples=4)
  algo = algorithms.loop()
  prep, state = algo.prepare(batch, algo.init())
  logp = testing.perturbed_logp(batch, scale=0.2)
  value, _ = algo.loss(logp, prep, state)
  ret = np.asarray(batch.extra["turn_rewards_PG"]).sum(-1)
  ret = ret + (np.asarray(batch.rewards_PG) - ret)  # the task reward
  g = ret.shape[1]
  loo = ret - (ret.sum(1, keepdims=True) - ret) / (g - 1)
  mask = np.asarray(batch.extra["loss_mask_PGT"]) * (
    np.asarray(batch.extra["turn_ids_PGT"]) >= 0
  )
  ratio = np.exp(np.asarray(logp, np.float64) - np.asarray(batch.old_logp_PGT))
  adv = loo[..., None]
  obj = np.minimum(ratio * adv, np.clip(ratio, 1 / 1.1, 1.1) * adv)
  rows = [
    -obj[i][mask[i] > 0].mean()
    for i in np.ndindex(loo.shape)
    if abs(loo[i]) >= 0.01 and mask[i].sum() > 0
  ]
  np.testing.assert_allclose(value.value, np.mean(rows), rtol=1e-5)


# --------------------------------------------------- issue 14's masks check


AGENT_PRESETS = [
  "episode_grpo",
  "episode_rloo",
  "gigpo",
  "hgpo",
  "loop",
  "poad",
  "salt",
  "seeupo",
  "turn_grpo",
]


@pytest.mark.parametrize("name", AGENT_PRESETS)
def test_observation_tokens_get_no_gradient_kl_or_entropy(name):
  """Two actions with an observation between them: the gradient of the
  loss (policy + KL + entropy bonus) w.r.t. the current log-probs and the
  entropies is exactly 0 on observation tokens and padding, and changing
  the reference log-probs or the entropies there changes nothing."""
  algo = algorithms.get(name)
  algo = algo._replace(
    transform=rljax.chain(
      objectives.kl_penalty(losses.kl_k3, coef=0.5),
      objectives.entropy_bonus(coef=0.3),
      algo.transform,  # SeeUPO's policy stage stays last
    )
  )
  batch = hand_batch()
  batch, state = algo.prepare(batch, algo.init())
  state = algo.observe(state, algo.measure(batch.old_logp_PGT, batch, state))
  logp = testing.perturbed_logp(batch)
  entropy = jnp.asarray(np.random.default_rng(1).uniform(0, 2, LOSS.shape))

  def loss(logp, entropy, batch):
    return algo.loss(logp, batch, state, entropy_PGT=entropy)[0].value

  grads = jax.jit(jax.grad(loss, argnums=(0, 1)))(logp, entropy, batch)
  for g in grads:
    assert np.all(np.asarray(g)[LOSS == 0] == 0)
    assert np.any(np.asarray(g)[LOSS > 0] != 0)
  noise = jnp.asarray(np.where(LOSS == 0, 5.0, 0.0), jnp.float32)
  moved = batch._replace(ref_logp_PGT=batch.ref_logp_PGT + noise)
  base = loss(logp, entropy, batch)
  np.testing.assert_array_equal(loss(logp, entropy, moved), base)
  np.testing.assert_array_equal(loss(logp, entropy + noise, batch), base)
  # The KL metric averages the action tokens only.
  metrics = rljax.finalize(
    algo.loss(logp, batch, state, entropy_PGT=entropy)[1]
  )
  kl = np.asarray(losses.kl_k3(logp, batch.ref_logp_PGT))
  np.testing.assert_allclose(metrics["kl_ref"], kl[LOSS > 0].mean(), rtol=1e-5)


def test_presets_jit_on_random_episode_batches():
  batch = agent_batch(4)
  logp = testing.perturbed_logp(batch)
  for name in AGENT_PRESETS:
    algo = algorithms.get(name)

    @functools.partial(jax.jit)
    def run(batch, logp, algo=algo):
      batch, state = algo.prepare(batch, algo.init())
      state = algo.observe(state, algo.measure(logp, batch, state))
      return jax.value_and_grad(lambda l: algo.loss(l, batch, state)[0].value)(
        logp
      )

    value, grad = run(batch, logp)
    assert np.isfinite(value), name
    assert np.all(np.asarray(grad)[np.asarray(batch.mask_PGT) == 0] == 0), name
