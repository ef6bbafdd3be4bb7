"""Turn-level estimators for multi-turn episodes (rljax.advantages._turns)
against numpy references that loop over steps and groups the way the
official codes do (verl-agent GiGPO and HGPO, ADRL's POAD buffer,
AgentEvolver's SeeUPO advantages), with hand-worked cases."""

import collections

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import advantages as A

# ---------------------------------------------------------------- references


def np_turn_returns(r, turns, gamma):
  out = np.zeros(r.shape)
  for p, g in np.ndindex(turns.shape):
    running = 0.0
    for k in reversed(range(turns[p, g])):
      running = r[p, g, k] + gamma * running
      out[p, g, k] = running
  return out


def np_normalise(values, scale, eps, ddof=1):
  """{key: list} -> {key: normalised list}; groups of one give 0."""
  vals = np.asarray(values, np.float64)
  if len(vals) < 2:
    return np.zeros_like(vals)
  centered = vals - vals.mean()
  if scale == "std":
    centered = centered / (vals.std(ddof=ddof) + eps)
  return centered


def np_grouped(values, keys, scale, eps, ddof=1):
  """Steps {(p, g, k): value} grouped by keys[(p, g, k)] -> advantages."""
  groups = collections.defaultdict(list)
  for step, key in keys.items():
    groups[key].append(step)
  out = {}
  for members in groups.values():
    adv = np_normalise([values[s] for s in members], scale, eps, ddof)
    out.update(zip(members, adv))
  return out


def steps_of(turns, valid=None):
  valid = np.ones(turns.shape, bool) if valid is None else valid
  return [
    (p, g, k)
    for p, g in np.ndindex(turns.shape)
    if valid[p, g]
    for k in range(turns[p, g])
  ]


def to_array(out, shape):
  arr = np.zeros(shape)
  for step, v in out.items():
    arr[step] = v
  return arr


def np_turn_grpo(returns, turns, valid=None, over="position", scale="std"):
  steps = steps_of(turns, valid)
  key = (lambda s: (s[0], s[2])) if over == "position" else (lambda s: s[0])
  out = np_grouped(
    {s: returns[s] for s in steps}, {s: key(s) for s in steps}, scale, 1e-6
  )
  return to_array(out, returns.shape)


def np_gigpo(r, sid, turns, valid=None, *, gamma, omega, scale, stats):
  """verl-agent: episode_norm_reward + build_step_group + step_norm_reward
  (groups of one: 0 here, rljax's convention)."""
  returns = np_turn_returns(r, turns, gamma)
  steps = steps_of(turns, valid)
  episode = {s: r[s[0], s[1], : turns[s[0], s[1]]].sum() for s in steps}
  if stats == "episodes":  # one score per trajectory (the paper)
    trajs = sorted({(p, g) for p, g, _ in steps})
    ep = np_grouped(
      {t: episode[(*t, 0)] for t in trajs},
      {t: t[0] for t in trajs},
      scale,
      1e-6,
    )
    ep = {s: ep[s[:2]] for s in steps}
  else:  # one score per step row (compute_mean_std_cross_steps)
    ep = np_grouped(episode, {s: s[0] for s in steps}, scale, 1e-6)
  anchored = [s for s in steps if sid[s] >= 0]
  st = np_grouped(
    {s: returns[s] for s in anchored},
    {s: (s[0], sid[s]) for s in anchored},
    scale,
    1e-6,
  )
  out = {s: ep[s] + omega * st.get(s, 0.0) for s in steps}
  return to_array(out, r.shape)


def np_hgpo(r, sid, turns, *, gamma, history, alpha, scale, base, eps=1e-6):
  """The official recipe's loops: clusters keyed (k, last k states)."""
  returns = np_turn_returns(r, turns, gamma)
  out = np.zeros(r.shape)
  for p in range(r.shape[0]):
    clusters = collections.defaultdict(list)
    for g in range(r.shape[1]):
      for t in range(turns[p, g]):
        for k in range(1, min(history + 1, t + 1) + 1):
          seq = tuple(sid[p, g, t - k + 1 : t + 1])
          if min(seq) >= 0:
            clusters[(k, seq)].append((g, t))
    items = collections.defaultdict(list)
    for (k, _), members in clusters.items():
      if len(members) > 1:
        vals = [returns[p, g, t] for g, t in members]
        for m, a in zip(members, np_normalise(vals, scale, eps, ddof=0)):
          items[m].append((k, a))
    if base:
      steps = [(g, t) for g in range(r.shape[1]) for t in range(turns[p, g])]
      ep = {s: r[p, s[0], : turns[p, s[0]]].sum() for s in steps}
      base_adv = np_normalise([ep[s] for s in steps], scale, eps, ddof=1)
      for s, a in zip(steps, base_adv):
        items[s].insert(0, (0, a))
    for (g, t), its in items.items():
      its = [(k, a) for k, a in its if a != 0]
      if its:
        w = np.array([(k + 1.0) ** alpha for k, _ in its])
        a = np.array([a for _, a in its])
        out[p, g, t] = (w * a).sum() / (w.sum() + eps)
  return out


def np_salt(adv, sid, aid, turns, valid=None):
  out = np.zeros(sid.shape)
  valid = np.ones(adv.shape, bool) if valid is None else valid
  for p in range(adv.shape[0]):
    nodes = collections.defaultdict(list)
    for g in range(adv.shape[1]):
      if not valid[p, g]:
        continue
      for k in range(turns[p, g]):
        prefix = tuple(zip(sid[p, g, : k + 1], aid[p, g, : k + 1]))
        nodes[prefix].append((g, k))
    for members in nodes.values():
      mean = np.mean([adv[p, g] for g, _ in members])
      for g, k in members:
        out[p, g, k] = mean
  return out


def np_action_gae(r, v, mask, ids, gamma, lam):
  """ADRL's batch_process_tppo per row: actions from last to first."""
  adv = np.zeros(r.shape)
  for row in np.ndindex(r.shape[:-1]):
    tokens = [t for t in range(r.shape[-1]) if mask[row][t] > 0]
    actions = collections.OrderedDict()
    for t in tokens:
      actions.setdefault(ids[row][t], []).append(t)
    acts = list(actions.values())
    gae, v_next_action = 0.0, 0.0
    for a in reversed(range(len(acts))):
      toks = acts[a]
      for j in reversed(range(len(toks))):
        t = toks[j]
        if j == len(toks) - 1:
          delta = r[row][t] + gamma * v_next_action - v[row][t]
          gae = delta + gamma * lam * gae
        else:
          delta = r[row][t] + v[row][toks[j + 1]] - v[row][t]
          gae = delta + lam * gae
        adv[row][t] = gae
      v_next_action = v[row][toks[0]]
  return adv, (adv + v) * (mask > 0)


def np_seeupo(returns, turns, n, valid=None, clip=3.0):
  valid = np.ones(returns.shape, bool) if valid is None else valid
  out = np.zeros((*returns.shape, n))
  for k in range(n):
    scored = {}
    for p in range(returns.shape[0]):
      members = [g for g in range(returns.shape[1]) if valid[p, g]]
      members = [g for g in members if turns[p, g] > k]
      if len(members) > 1:
        mean = np.mean([returns[p, g] for g in members])
        for g in members:
          scored[(p, g)] = returns[p, g] - mean
    if not scored:
      continue
    a = np.array(list(scored.values()))
    m, s = a.mean(), (a.std(ddof=1) if len(a) > 1 else 0.0)
    for (p, g), x in scored.items():
      z = (x - m) / s if s > 1e-6 else x - m
      out[p, g, k] = np.clip(z, -clip, clip)
  return out


def random_episodes(seed, p=3, g=5, n=4, states=3):
  rng = np.random.default_rng(seed)
  turns = rng.integers(0, n + 1, (p, g)).astype(np.int32)
  turns[0, 0] = n  # someone reaches the last turn
  alive = np.arange(n) < turns[..., None]
  r = np.where(alive, rng.normal(size=(p, g, n)), 0.0).astype(np.float32)
  sid = np.where(alive, rng.integers(0, states, (p, g, n)), -1)
  sid[0, 1, 0] = -1  # a step whose state was not reported
  return r, sid.astype(np.int32), turns


# ------------------------------------------------------------ turn returns


def test_turn_returns_hand_worked_and_jitted():
  # r = [1, 0, 2], gamma 0.5: G2 = 2, G1 = 0 + 0.5 * 2 = 1, G0 = 1 + 0.5 = 1.5.
  # With 2 turns the reward 2 lies past the end: G1 = 0, G0 = 1.
  r = np.array([[[1.0, 0.0, 2.0], [1.0, 0.0, 2.0]]], np.float32)
  turns = np.array([[3, 2]], np.int32)
  got = jax.jit(lambda r, t: A.turn_returns(r, t, gamma=0.5))(r, turns)
  np.testing.assert_allclose(got, [[[1.5, 1.0, 2.0], [1.0, 0.0, 0.0]]])


def test_turn_returns_match_numpy_and_gradients():
  r, _, turns = random_episodes(0)
  got = A.turn_returns(r, turns, gamma=0.9)
  np.testing.assert_allclose(got, np_turn_returns(r, turns, 0.9), atol=1e-5)
  # Linear: dG_k / dr_l = gamma^(l - k) for k <= l < turns.
  c = np.random.default_rng(1).normal(size=r.shape)
  grad = jax.jit(
    jax.grad(lambda x: jnp.sum(A.turn_returns(x, turns, gamma=0.9) * c))
  )(jnp.asarray(r))
  want = np.zeros(r.shape)
  for p, g in np.ndindex(turns.shape):
    for l_ in range(turns[p, g]):
      want[p, g, l_] = sum(c[p, g, k] * 0.9 ** (l_ - k) for k in range(l_ + 1))
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_turns_to_tokens_and_rewards_to_last_action_token():
  # Tokens: a0 a0 o0 a1 pad; turn ids 0 0 0 1 -1; action mask 1 1 0 1 0.
  ids = np.array([[[0, 0, 0, 1, -1]]], np.int32)
  mask = np.array([[[1, 1, 0, 1, 0]]], np.float32)
  values = np.array([[[5.0, 7.0]]], np.float32)
  np.testing.assert_array_equal(
    A.turns_to_tokens(values, ids), [[[5.0, 5.0, 5.0, 7.0, 0.0]]]
  )
  # Turn 0's reward lands on its last action token (t=1), not the
  # observation (t=2); turn 1's on t=3.
  np.testing.assert_array_equal(
    jax.jit(A.turn_rewards_to_tokens)(values, ids, mask),
    [[[0.0, 5.0, 0.0, 7.0, 0.0]]],
  )
  x = np.arange(5, dtype=np.float32)[None, None]
  np.testing.assert_array_equal(A.per_turn_sum(x, ids, mask, 2), [[[1.0, 3.0]]])


# ---------------------------------------------------------- turn-level GRPO


def test_turn_grpo_hand_worked():
  # Returns: ep0 [2, 1], ep1 [0, 1], ep2 [1] (one turn).
  g_ = np.array([[[2.0, 1.0], [0.0, 1.0], [1.0, 9.0]]], np.float32)
  turns = np.array([[2, 2, 1]], np.int32)
  # position: turn 0 {2, 0, 1} mean 1 -> [1, -1, 0]; turn 1 {1, 1} -> 0.
  # With std (ddof 1): turn 0 std 1 -> same; turn 1 std 0 -> 0.
  for scale in ["none", "std"]:
    got = A.turn_grpo(g_, turns, scale=scale)
    np.testing.assert_allclose(
      got, [[[1, 0], [-1, 0], [0, 0]]], rtol=1e-5, atol=1e-6
    )
  # group: all five turns {2, 1, 0, 1, 1} mean 1.
  got = A.turn_grpo(g_, turns, over="group", scale="none")
  np.testing.assert_allclose(got, [[[1, 0], [-1, 0], [0, 0]]], atol=1e-6)


@pytest.mark.parametrize("over", ["position", "group"])
@pytest.mark.parametrize("scale", ["std", "none"])
def test_turn_grpo_matches_numpy_jitted(over, scale):
  r, _, turns = random_episodes(2)
  valid = np.random.default_rng(3).random(turns.shape) > 0.2
  returns = np_turn_returns(r, turns, 0.9).astype(np.float32)
  got = jax.jit(lambda x, t, v: A.turn_grpo(x, t, v, over=over, scale=scale))(
    returns, turns, valid
  )
  want = np_turn_grpo(returns, turns, valid, over, scale)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_one_turn_episodes_reduce_to_grpo():
  rng = np.random.default_rng(4)
  rewards = rng.normal(size=(3, 5)).astype(np.float32)
  turns = np.ones((3, 5), np.int32)
  for over in ["position", "group"]:
    got = A.turn_grpo(rewards[..., None], turns, over=over)
    np.testing.assert_allclose(
      got[..., 0], A.grpo(rewards), rtol=1e-5, atol=1e-6
    )


# -------------------------------------------------------------------- GiGPO


def test_gigpo_hand_worked():
  # gamma 0.5. ep0: states [0, 1], rewards [0, 1] -> R_t = [0.5, 1], R = 1.
  # ep1: states [0, 2], rewards [0, 0] -> R_t = [0, 0], R = 0.
  # ep2: state [0], reward [1] (one turn) -> R_t = [1], R = 1.
  r = np.array([[[0, 1], [0, 0], [1, 0]]], np.float32)
  sid = np.array([[[0, 1], [0, 2], [0, -1]]], np.int32)
  turns = np.array([[2, 2, 1]], np.int32)
  # A^E (std): R = [1, 0, 1], mean 2/3, std sqrt(1/3) -> [.57735, -1.1547,
  # .57735]. Anchor state 0: R_t {0.5, 0, 1}, mean .5, std .5 ->
  # [0, -1, 1]; states 1 and 2 hold one step each -> A^S = 0.
  got = jax.jit(lambda *a: A.gigpo(*a, gamma=0.5))(r, sid, turns)
  e = 1 / np.sqrt(3)
  want = [[[e, e], [-2 * e - 1, -2 * e], [e + 1, 0]]]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # mean_norm (F = 1): A^E = [1/3, -2/3, 1/3], A^S = [0, -.5, .5].
  got = A.gigpo(r, sid, turns, gamma=0.5, scale="none")
  want = [[[1 / 3, 1 / 3], [-2 / 3 - 0.5, -2 / 3], [1 / 3 + 0.5, 0]]]
  np.testing.assert_allclose(got, want, rtol=1e-5)
  # omega scales the step part only.
  step = A.anchor_advantages(A.turn_returns(r, turns, gamma=0.5), sid, turns)
  np.testing.assert_allclose(step, [[[0, 0], [-1, 0], [1, 0]]], atol=1e-5)


@pytest.mark.parametrize("scale", ["std", "none"])
@pytest.mark.parametrize("stats", ["episodes", "steps"])
def test_gigpo_matches_verl_agent_reference(scale, stats):
  r, sid, turns = random_episodes(5, states=2)
  valid = np.random.default_rng(6).random(turns.shape) > 0.15
  kw = dict(gamma=0.95, omega=0.7, scale=scale)
  got = jax.jit(lambda *a: A.gigpo(*a, episode_stats=stats, **kw))(
    r, sid, turns, valid
  )
  want = np_gigpo(r, sid, turns, valid, stats=stats, **kw)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_gigpo_lone_and_unknown_states_get_no_step_advantage():
  r, sid, turns = random_episodes(7, states=50)  # almost all states unique
  unknown = np.full_like(sid, -1)
  base = A.gigpo(r, unknown, turns, omega=1.0)
  # With no anchor groups A = A^E on every turn: GRPO of the returns.
  # (episodes that took no action are left out of the statistics)
  ep = A.grpo(np_turn_returns(r, turns, 1.0)[..., 0], turns > 0)
  alive = np.arange(r.shape[-1]) < turns[..., None]
  np.testing.assert_allclose(
    base, np.where(alive, np.asarray(ep)[..., None], 0), rtol=1e-5, atol=1e-6
  )
  lone = np.where(sid >= 0, np.arange(sid.size).reshape(sid.shape), -1)
  np.testing.assert_allclose(
    A.gigpo(r, lone.astype(np.int32), turns), base, atol=1e-6
  )


def test_gigpo_gradients_match_finite_differences():
  r, sid, turns = random_episodes(8, p=2, g=4, n=3, states=2)
  c = np.random.default_rng(9).normal(size=r.shape)
  kw = dict(gamma=0.9, omega=1.0, scale="std")

  def f(x):
    return jnp.sum(A.gigpo(x, sid, turns, **kw) * c)

  grad = np.asarray(jax.jit(jax.grad(f))(jnp.asarray(r)))
  want = np.zeros(r.shape)
  r64 = r.astype(np.float64)
  for idx in np.ndindex(r.shape):
    step = np.zeros(r.shape)
    step[idx] = 1e-5
    up = (np_gigpo(r64 + step, sid, turns, stats="episodes", **kw) * c).sum()
    down = (np_gigpo(r64 - step, sid, turns, stats="episodes", **kw) * c).sum()
    want[idx] = (up - down) / 2e-5
  np.testing.assert_allclose(grad, want, rtol=2e-3, atol=2e-4)


# --------------------------------------------------------------------- HGPO


def test_hgpo_hand_worked():
  # gamma 1, history 1 (levels k = 1, 2), alpha 1: weights 2 and 3.
  # ep0: states [0, 1], rewards [0, 1] -> R_t [1, 1]
  # ep1: states [0, 1], rewards [0, 0] -> R_t [0, 0]
  # ep2: states [2, 1], rewards [0, 1] -> R_t [1, 1]
  r = np.array([[[0, 1], [0, 0], [0, 1]]], np.float32)
  sid = np.array([[[0, 1], [0, 1], [2, 1]]], np.int32)
  turns = np.full((1, 3), 2, np.int32)
  kw = dict(gamma=1.0, history=1, alpha=1.0)
  # mean_norm. t0: level 1 {ep0: 1, ep1: 0} -> +-.5; ep2 alone -> 0.
  # t1: level 1 {1, 0, 1} mean 2/3 -> 1/3, -2/3, 1/3; level 2 (0, 1):
  # {ep0, ep1} -> +-.5. ep0 t1 = (2/3 + 1.5) / 5 = .43333,
  # ep1 t1 = (-4/3 - 1.5) / 5 = -.56667, ep2 t1 = 1/3 (level 1 only).
  got = jax.jit(lambda *a: A.hgpo(*a, scale="none", **kw))(r, sid, turns)
  want = [[[0.5, 0.43333333], [-0.5, -0.56666667], [0, 1 / 3]]]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # mean_std_norm (biased std): t0 {1, 0} -> +-1; t1 level 1 std
  # sqrt(2/9) -> .70711, -1.41421; level 2 -> +-1. ep0 t1 =
  # (1.41421 + 3) / 5 = .88284, ep1 t1 = (-2.82843 - 3) / 5 = -1.16569.
  got = A.hgpo(r, sid, turns, scale="std", **kw)
  want = [[[1, 0.88284271], [-1, -1.16568542], [0, 0.70710678]]]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scale", ["std", "none"])
@pytest.mark.parametrize("base", [False, True])
@pytest.mark.parametrize("history,alpha", [(0, 1.0), (2, 1.0), (3, 0.0)])
def test_hgpo_matches_official_recipe_reference(scale, base, history, alpha):
  r, sid, turns = random_episodes(10, n=5, states=2)
  kw = dict(gamma=0.95, history=history, alpha=alpha, scale=scale)
  got = jax.jit(lambda *a: A.hgpo(*a, base_group=base, **kw))(r, sid, turns)
  want = np_hgpo(r, sid, turns, base=base, **kw)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_hgpo_history_0_is_gigpo_step_advantage_with_biased_std():
  r, sid, turns = random_episodes(11, states=2)
  got = A.hgpo(r, sid, turns, history=0, scale="none", gamma=0.9)
  step = A.anchor_advantages(
    A.turn_returns(r, turns, gamma=0.9), sid, turns, scale="none"
  )
  np.testing.assert_allclose(got, step, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------- SALT


def test_salt_hand_worked():
  # adv [1, -1, .5]. Step 0: ep0 and ep1 share (state 0, action 7) ->
  # node mean 0; ep2 took action 5 -> .5. Step 1: ep0 and ep1 part
  # (actions 8 vs 9): 1 and -1; ep2: .5.
  adv = np.array([[1.0, -1.0, 0.5]], np.float32)
  sid = np.array([[[0, 1], [0, 1], [0, 3]]], np.int32)
  aid = np.array([[[7, 8], [7, 9], [5, 8]]], np.int32)
  turns = np.full((1, 3), 2, np.int32)
  got = jax.jit(A.salt)(adv, sid, aid, turns)
  np.testing.assert_allclose(got, [[[0, 1], [0, -1], [0.5, 0.5]]], atol=1e-6)


def test_salt_matches_numpy_prefix_nodes():
  rng = np.random.default_rng(12)
  _, sid, turns = random_episodes(12, p=3, g=6, n=4, states=2)
  aid = rng.integers(0, 2, sid.shape).astype(np.int32)
  adv = rng.normal(size=turns.shape).astype(np.float32)
  valid = rng.random(turns.shape) > 0.2
  noisy = np.where(valid, adv, np.nan).astype(np.float32)
  got = A.salt(noisy, sid, aid, turns, valid)
  np.testing.assert_allclose(
    got, np_salt(adv, sid, aid, turns, valid), rtol=1e-5, atol=1e-6
  )
  # Gradient: dA_step / dA(tau) = 1 / |node| for the node's trajectories.
  c = rng.normal(size=sid.shape)
  grad = jax.jit(jax.grad(lambda a: jnp.sum(A.salt(a, sid, aid, turns) * c)))(
    adv
  )
  want = np.zeros(adv.shape)
  for idx in np.ndindex(adv.shape):
    e = np.zeros(adv.shape)
    e[idx] = 1.0
    want[idx] = (np_salt(e, sid, aid, turns) * c).sum()  # linear in adv
  np.testing.assert_allclose(grad, want, rtol=1e-5, atol=1e-6)


def test_action_hashes_identify_equal_actions():
  # Row 0: action [3, 4], obs [9], action [5]; row 1: action [3, 4] with a
  # different observation, then action [5, 0]; row 2: action [4, 3].
  tokens = np.array([[[3, 4, 9, 5, 0], [3, 4, 8, 5, 0], [4, 3, 9, 5, 0]]])
  ids = np.array([[[0, 0, 0, 1, -1], [0, 0, 0, 1, 1], [0, 0, 0, 1, -1]]])
  mask = np.array([[[1, 1, 0, 1, 0], [1, 1, 0, 1, 1], [1, 1, 0, 1, 0]]])
  h = np.asarray(
    jax.jit(A.action_hashes, static_argnums=3)(
      tokens.astype(np.int32), ids.astype(np.int32), mask, 2
    )
  )
  assert h.dtype == np.uint32
  assert h[0, 0, 0] == h[0, 1, 0]  # same action, observations differ
  assert h[0, 0, 0] != h[0, 2, 0]  # same tokens, other order
  assert h[0, 0, 1] != h[0, 1, 1]  # [5] vs [5, 0]: the length counts
  assert h[0, 0, 1] == h[0, 2, 1]


# ----------------------------------------------------------------- POAD/BAD


def test_action_gae_hand_worked():
  # Tokens a0 a0 o0 o0 a1 a1; rewards on the actions' last tokens (1, 2);
  # V = [.5, .6, 9, 9, .2, .3] (observation values are skipped).
  # gamma .5, lam 1:
  # t5 (last of a1, episode end): delta = 2 - .3 = 1.7, A = 1.7
  # t4 (inside a1): delta = .3 - .2 = .1, A = .1 + 1.7 = 1.8
  # t1 (last of a0): delta = 1 + .5 * .2 - .6 = .5, A = .5 + .5 * 1.8 = 1.4
  # t0 (inside a0): delta = .6 - .5 = .1, A = .1 + 1.4 = 1.5
  r = np.array([[[0, 1, 0, 0, 0, 2]]], np.float32)
  v = np.array([[[0.5, 0.6, 9, 9, 0.2, 0.3]]], np.float32)
  m = np.array([[[1, 1, 0, 0, 1, 1]]], np.float32)
  ids = np.array([[[0, 0, 0, 0, 1, 1]]], np.int32)
  f = jax.jit(lambda *a: A.action_gae(*a, gamma=0.5, lam=1.0))
  adv, ret = f(r, v, m, ids)
  np.testing.assert_allclose(adv, [[[1.5, 1.4, 0, 0, 1.8, 1.7]]], rtol=1e-6)
  np.testing.assert_allclose(ret, [[[2.0, 2.0, 0, 0, 2.0, 2.0]]], rtol=1e-6)
  # lam .5: t4 = .1 + .5 * 1.7 = .95; t1 = .5 + .25 * .95 = .7375;
  # t0 = .1 + .5 * .7375 = .46875.
  adv, _ = A.action_gae(r, v, m, ids, gamma=0.5, lam=0.5)
  np.testing.assert_allclose(
    adv, [[[0.46875, 0.7375, 0, 0, 0.95, 1.7]]], rtol=1e-6
  )


def random_token_episodes(seed, p=2, g=3, t=14):
  """Rows of alternating action / observation runs, then padding."""
  rng = np.random.default_rng(seed)
  ids = np.full((p, g, t), -1, np.int32)
  mask = np.zeros((p, g, t), np.float32)
  for row in np.ndindex(p, g):
    pos, k = 0, 0
    end = rng.integers(4, t + 1)
    while pos < end:
      act = rng.integers(1, 4)
      obs = rng.integers(0, 3)
      ids[row][pos : min(pos + act + obs, end)] = k
      mask[row][pos : min(pos + act, end)] = 1
      pos, k = pos + act + obs, k + 1
  r = (rng.normal(size=(p, g, t)) * mask).astype(np.float32)
  v = rng.normal(size=(p, g, t)).astype(np.float32)
  return r, v, mask, ids


@pytest.mark.parametrize("gamma,lam", [(0.95, 0.95), (0.5, 1.0), (1.0, 0.7)])
def test_action_gae_matches_adrl_reference(gamma, lam):
  r, v, m, ids = random_token_episodes(13)
  adv, ret = A.action_gae(r, v, m, ids, gamma=gamma, lam=lam)
  want_adv, want_ret = np_action_gae(r, v, m, ids, gamma, lam)
  np.testing.assert_allclose(adv, want_adv, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, want_ret, rtol=1e-5, atol=1e-5)
  # Gradient w.r.t. the values (linear): finite differences of the reference.
  c = np.random.default_rng(14).normal(size=r.shape)
  grad = jax.jit(
    jax.grad(
      lambda x: jnp.sum(A.action_gae(r, x, m, ids, gamma=gamma, lam=lam)[0] * c)
    )
  )(v)
  want = np.zeros(v.shape)
  v64 = v.astype(np.float64)
  for idx in np.ndindex(v.shape):
    e = np.zeros(v.shape)
    e[idx] = 1e-3
    up = (np_action_gae(r, v64 + e, m, ids, gamma, lam)[0] * c).sum()
    down = (np_action_gae(r, v64 - e, m, ids, gamma, lam)[0] * c).sum()
    want[idx] = (up - down) / 2e-3
  np.testing.assert_allclose(grad, want, rtol=1e-4, atol=1e-4)


def test_action_gae_with_gamma_1_is_gae():
  r, v, m, ids = random_token_episodes(15)
  got = A.action_gae(r, v, m, ids, gamma=1.0, lam=0.9)
  want = A.gae(r, v, m, gamma=1.0, lam=0.9)
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("estimator", ["gae", "action_gae"])
def test_observation_tokens_are_skipped(estimator):
  """An episode with observation tokens masked out gives its action tokens
  exactly the advantages of the same episode with the observations
  removed, whatever rewards and values the observations carry."""
  r, v, m, ids = random_token_episodes(16)

  def run(r, v, m, ids):
    if estimator == "gae":
      return A.gae(r, v, m, gamma=0.9, lam=0.8)
    return A.action_gae(r, v, m, ids, gamma=0.9, lam=0.8)

  adv, ret = run(r, v, m, ids)
  rng = np.random.default_rng(17)
  noise = rng.normal(size=r.shape).astype(np.float32) * (1 - m)
  adv2, ret2 = run(r + noise, v + noise, m, ids)
  np.testing.assert_array_equal(adv, adv2)
  np.testing.assert_array_equal(ret, ret2)
  for row in np.ndindex(m.shape[:-1]):
    keep = m[row] > 0
    compact = [x[row][keep][None, None] for x in (r, v, m, ids)]
    a, b = run(*compact)
    np.testing.assert_allclose(np.asarray(adv)[row][keep], a[0, 0], rtol=1e-6)
    np.testing.assert_allclose(np.asarray(ret)[row][keep], b[0, 0], rtol=1e-6)
  assert np.all(np.asarray(adv)[m == 0] == 0)


# ------------------------------------------------------------------- SeeUPO


def test_seeupo_hand_worked():
  # p0: R = [1, 0], turns [2, 1]; p1: R = [0, 3], turns [2, 2].
  # Turn 0: a = [.5, -.5, -1.5, 1.5], mean 0, std sqrt(5/3) = 1.29099 ->
  # [.38730, -.38730, -1.16190, 1.16190]. Turn 1: p0 has one episode
  # there (no baseline, 0); p1 a = [-1.5, 1.5], std 2.12132 -> -+.70711.
  returns = np.array([[1.0, 0.0], [0.0, 3.0]], np.float32)
  turns = np.array([[2, 1], [2, 2]], np.int32)
  got = jax.jit(A.seeupo, static_argnums=2)(returns, turns, 2)
  want = [
    [[0.38729833, 0.0], [-0.38729833, 0.0]],
    [[-1.161895, -0.70710678], [1.161895, 0.70710678]],
  ]
  np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # The clip bounds |A|.
  got = A.seeupo(returns, turns, 2, clip=0.5)
  assert np.max(np.abs(got)) == pytest.approx(0.5)


def test_seeupo_matches_agentevolver_reference():
  rng = np.random.default_rng(18)
  turns = rng.integers(0, 5, (4, 6)).astype(np.int32)
  returns = rng.normal(size=(4, 6)).astype(np.float32) * 3
  valid = rng.random((4, 6)) > 0.2
  got = A.seeupo(returns, turns, 4, valid, clip=1.5)
  want = np_seeupo(returns, turns, 4, valid, clip=1.5)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------- bad input


def test_bad_inputs_are_clear_errors():
  r, sid, turns = random_episodes(19)
  with pytest.raises(ValueError, match="turn_rewards_PGN must have rank 3"):
    A.turn_returns(r[..., 0], turns)
  with pytest.raises(ValueError, match="state_ids_PGN must hold integer"):
    A.gigpo(r, sid.astype(np.float32), turns)
  with pytest.raises(ValueError, match="turns_PG must hold integer"):
    A.turn_returns(r, turns.astype(np.float32))
  with pytest.raises(ValueError, match="leading dimensions"):
    A.gigpo(r, sid, turns[:, :2])
  with pytest.raises(ValueError, match="per-turn arrays must have one shape"):
    A.gigpo(r, sid[..., :2], turns)
  with pytest.raises(ValueError, match="gamma"):
    A.turn_returns(r, turns, gamma=1.5)
  with pytest.raises(ValueError, match="over"):
    A.turn_grpo(r, turns, over="episode")
  with pytest.raises(ValueError, match="scale"):
    A.gigpo(r, sid, turns, scale="mean_std_norm")
  with pytest.raises(ValueError, match="episode_stats"):
    A.gigpo(r, sid, turns, episode_stats="trajectories")
  with pytest.raises(ValueError, match="history"):
    A.hgpo(r, sid, turns, history=-1)
  with pytest.raises(ValueError, match="turn_ids_PGT must hold integer"):
    A.turns_to_tokens(r, np.zeros((3, 5, 7), np.float32))
  with pytest.raises(ValueError, match="shapes must match"):
    A.action_gae(
      np.zeros((1, 1, 4)), np.zeros((1, 1, 4)), np.ones((1, 1, 4)),
      np.zeros((1, 1, 3), np.int32),
    )  # fmt: skip
