"""Tool-use credit (OTC, THOR, ToolPO, InfoPO, PORTool) against numpy
references written with loops, hand-worked cases, finite-difference
gradients and the batch stages on hand-built agent batches."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import rljax
from rljax import advantages
from rljax import testing
from rljax import transforms as T
from rljax.models import ModelConfig
from rljax.models import token_logprobs

EPS = 1e-6


def np_z(values, eps=EPS):
  """GRPO z-scores of a list (0 for fewer than 2)."""
  v = np.asarray(values, np.float64)
  if len(v) < 2:
    return np.zeros_like(v)
  return (v - v.mean()) / (v.std(ddof=1) + eps)


def np_grpo(r, valid, eps=EPS):
  out = np.zeros(np.shape(r))
  for p in range(r.shape[0]):
    idx = [g for g in range(r.shape[1]) if valid[p, g]]
    out[p, idx] = np_z(r[p, idx], eps)
  return out


def jgrad(f, **kwargs):
  """jax.grad, jitted (one compiled call instead of op-by-op dispatch)."""
  return jax.jit(jax.grad(f, **kwargs))


def fd_grad(f, x, step=1e-4):
  """Central finite differences of a scalar numpy function."""
  x = np.asarray(x, np.float64)
  out = np.zeros_like(x)
  for idx in np.ndindex(x.shape):
    d = np.zeros_like(x)
    d[idx] = step
    out[idx] = (f(x + d) - f(x - d)) / (2 * step)
  return out


# ---------------------------------------------------------------------------
# A hand-built agent batch: P = 1, G = 2, N = 3, T = 10.
#   g0: a0 a0 o0 o0 | a1 o1 | a2 a2 | pad pad
#   g1: a0 o0 | a1 a1 o1 | pad ...
# ---------------------------------------------------------------------------

TURN_IDS = np.array(
  [[[0, 0, 0, 0, 1, 1, 2, 2, -1, -1], [0, 0, 1, 1, 1, -1, -1, -1, -1, -1]]],
  np.int32,
)
ACTIONS = np.array(
  [[[1, 1, 0, 0, 1, 0, 1, 1, 0, 0], [1, 0, 1, 1, 0, 0, 0, 0, 0, 0]]],
  np.float32,
)


def agent_batch(rewards, calls, errors, **extra):
  batch = rljax.Batch(
    mask_PGT=ACTIONS, rewards_PG=np.asarray(rewards, np.float32)
  )
  return batch.with_extra(
    turn_ids_PGT=TURN_IDS,
    tool_calls_PG=np.asarray(calls, np.int32),
    tool_errors_PG=np.asarray(errors, np.int32),
    **extra,
  )


# ---------------------------------------------------------------------------
# OTC.
# ---------------------------------------------------------------------------


def np_tool(m, n, c):
  if m == 0 and n == 0:
    return 1.0
  if n == 0:
    return math.cos(m * math.pi / (2 * m + c))
  f = 2 * n * m / (m + n)
  return math.sin(f * math.pi / (2 * n))


def np_otc(r, m, valid, variant="grpo", c=1.0, alpha=1.0, among="correct"):
  out = np.array(r, np.float64)
  for p in range(r.shape[0]):
    ok = [valid[p, g] and r[p, g] > 0 for g in range(r.shape[1])]
    pool = [
      m[p, g]
      for g in range(r.shape[1])
      if (ok[g] if among == "correct" else valid[p, g])
    ]
    n = 0.0 if variant == "ppo" or not pool else min(pool)
    for g in range(r.shape[1]):
      if ok[g]:
        out[p, g] = alpha * np_tool(m[p, g], n, c) * r[p, g]
  return out


def test_otc_tool_reward_hand_worked():
  # (m, n): (0, 0) -> 1; (1, 0), c = 1: cos(pi/3) = .5; (2, 2): f = 2,
  # sin(pi/2) = 1; (3, 2): f = 12/5 = 2.4, sin(.6 pi) = .9510565;
  # (1, 2): f = 4/3, sin(pi/3) = .8660254; (0, 2): f = 0 -> 0.
  got = T.otc_tool_reward([0, 1, 2, 3, 1, 0], [0, 0, 2, 2, 2, 2])
  np.testing.assert_allclose(
    got, [1.0, 0.5, 1.0, 0.9510565, 0.8660254, 0.0], atol=1e-6
  )
  # c = 3 decays slower: cos(pi/5) = .809017.
  np.testing.assert_allclose(T.otc_tool_reward(1, 0, c=3.0), 0.809017, 1e-6)


@pytest.mark.parametrize("variant", ["grpo", "ppo"])
@pytest.mark.parametrize("among", ["correct", "all"])
def test_otc_rewards_match_numpy_reference_jitted(variant, among):
  rng = np.random.default_rng(0)
  r = rng.integers(0, 2, (6, 5)).astype(np.float32)
  r[0] *= rng.uniform(0.2, 1.0, 5).astype(np.float32)  # F1-like scores
  r[1] = 0.0  # no correct sample
  m = rng.integers(0, 6, (6, 5)).astype(np.float32)
  valid = rng.random((6, 5)) > 0.2
  kw = dict(variant=variant, c=2.0, alpha=0.8, among=among)
  got = jax.jit(lambda a, b, v: T.otc_rewards_of(a, b, v, **kw))(r, m, valid)
  np.testing.assert_allclose(got, np_otc(r, m, valid, **kw), atol=1e-6)


def test_otc_gradient_in_calls_matches_finite_differences():
  m = np.array([0.5, 1.0, 2.5, 4.0])
  n = np.array([0.0, 2.0, 2.0, 1.0])
  grad = jgrad(lambda x: jnp.sum(T.otc_tool_reward(x, n, c=1.5)))(
    jnp.asarray(m, jnp.float32)
  )
  want = fd_grad(
    lambda x: sum(np_tool(a, b, 1.5) for a, b in zip(x, n)), m, 1e-5
  )
  np.testing.assert_allclose(grad, want, rtol=1e-3, atol=1e-5)


def test_otc_rewards_stage():
  # g0: correct with 3 calls, g1: correct with 1 call -> n = 1.
  calls = [[[1, 1, 1], [1, 0, 0]]]
  batch = agent_batch([[1.0, 1.0]], calls, np.zeros((1, 2, 3)))
  out, _ = rljax.Algorithm(T.otc_rewards(), rljax.aggregate.token_mean).prepare(
    batch, ()
  )
  # g0: f = 2*1*3/4 = 1.5, sin(1.5 pi/2) = .7071068; g1: 1.
  np.testing.assert_allclose(out.rewards_PG, [[0.7071068, 1.0]], atol=1e-6)
  # A reward column as r_phi.
  cols = batch._replace(rewards_PGK=np.array([[[0.0, 1.0], [1.0, 0.0]]]))
  out, _ = T.otc_rewards(column=1, variant="ppo").prepare(cols, ())
  # Column 1 is [1, 0]; OTC-PPO: g0 cos(3 pi / 7) (m = 3, c = 1), g1 0.
  np.testing.assert_allclose(
    out.rewards_PG, [[math.cos(3 * math.pi / 7), 0.0]], atol=1e-6
  )


def test_otc_errors():
  with pytest.raises(ValueError, match="variant"):
    T.otc_rewards(variant="dpo")
  with pytest.raises(ValueError, match="c must be > 0"):
    T.otc_tool_reward(1, 0, c=0.0)
  with pytest.raises(ValueError, match="shapes must match"):
    T.otc_rewards_of(np.ones((2, 3)), np.ones((2, 4)))
  batch = rljax.Batch(mask_PGT=np.ones((1, 2, 3)), rewards_PG=np.ones((1, 2)))
  with pytest.raises(ValueError, match="tool_calls_PG"):
    T.otc_rewards().prepare(batch, ())
  with pytest.raises(ValueError, match="column 5 is out of range"):
    T.otc_rewards(column=5).prepare(
      batch._replace(rewards_PGK=np.ones((1, 2, 2))).with_extra(
        tool_calls_PG=np.ones((1, 2, 3), np.int32)
      ),
      (),
    )


# ---------------------------------------------------------------------------
# THOR.
# ---------------------------------------------------------------------------


def np_thor(rewards, calls, errors, valid, groups=None, eps=EPS):
  a_traj = np_grpo(rewards, valid, eps)
  a_step = np.zeros(calls.shape)
  p_size, g_size, n_size = calls.shape
  for p in range(p_size):
    members = [
      (g, k)
      for g in range(g_size)
      for k in range(n_size)
      if valid[p, g] and calls[p, g, k] > 0
    ]
    key = {(g, k): 0 if groups is None else groups[p, g, k] for g, k in members}
    for g, k in members:
      same = [(h, j) for h, j in members if key[h, j] == key[g, k]]
      vals = [float(errors[p, h, j] == 0) for h, j in same]
      a_step[p, g, k] = np_z(vals, eps)[same.index((g, k))]
  return a_traj, a_step


def test_thor_hand_worked():
  # Steps: g0 turn 0 ok (1), g0 turn 1 failed (0), g1 turn 0 ok (1).
  # Pooled: mean 2/3, unbiased std sqrt(1/3) = .5773503:
  # z = [.5773503, -1.1547005, .5773503]. A_traj: R = [1, 0] -> +-.7071068.
  calls = np.array([[[1, 1, 0], [1, 0, 0]]])
  errors = np.array([[[0, 1, 0], [0, 0, 0]]])
  r_step, steps = T.thor_step_rewards_of(calls, errors)
  np.testing.assert_array_equal(r_step, [[[1, 0, 0], [1, 0, 0]]])
  a_traj, a_step = T.thor_advantages_of([[1.0, 0.0]], r_step, steps)
  np.testing.assert_allclose(a_traj, [[0.7071068, -0.7071068]], atol=1e-5)
  np.testing.assert_allclose(
    a_step, [[[0.5773503, -1.1547005, 0], [0.5773503, 0, 0]]], atol=1e-5
  )
  # The stage: A_traj on every action token, + A_step on tool steps' tokens.
  out, _ = T.thor_advantages(step_coef=0.5).prepare(
    agent_batch([[1.0, 0.0]], calls, errors), ()
  )
  s, t = 0.5 * 0.5773503, 0.5 * -1.1547005
  want = [
    [0.70711 + s] * 2 + [0, 0] + [0.70711 + t, 0] + [0.70711] * 2 + [0, 0],
    [-0.70711 + s, 0, -0.70711, -0.70711] + [0] * 6,
  ]
  np.testing.assert_allclose(out.advantages_PGT[0], want, atol=1e-4)


@pytest.mark.parametrize("grouped", [False, True])
def test_thor_matches_numpy_reference_jitted(grouped):
  rng = np.random.default_rng(1)
  shape = (4, 5, 3)
  calls = rng.integers(0, 3, shape)
  errors = np.minimum(calls, rng.integers(0, 2, shape))
  rewards = rng.integers(0, 2, shape[:2]).astype(np.float32)
  valid = rng.random(shape[:2]) > 0.2
  groups = rng.integers(0, 2, shape).astype(np.int32) if grouped else None
  r_step, steps = T.thor_step_rewards_of(calls, errors)
  got = jax.jit(
    lambda r, s, st, v, gr: T.thor_advantages_of(
      r, s, st, v, step_groups_PGN=gr
    )
  )(rewards, r_step, steps, valid, groups)
  want = np_thor(rewards, calls, errors, valid, groups)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], atol=1e-5)


def test_thor_gradients_match_finite_differences():
  rng = np.random.default_rng(2)
  rewards = rng.normal(size=(2, 4))
  step_r = rng.normal(size=(2, 4, 3))
  steps = rng.random((2, 4, 3)) > 0.3
  c1, c2 = rng.normal(size=(2, 4)), rng.normal(size=(2, 4, 3))

  def ours(r, s):
    a, b = T.thor_advantages_of(r, s, steps)
    return jnp.sum(a * c1) + jnp.sum(b * c2)

  def ref(r, s):
    a = np_grpo(r, np.ones((2, 4), bool))
    b = np.zeros_like(s)
    for p in range(2):
      idx = list(zip(*np.nonzero(steps[p])))
      z = np_z([s[p, g, k] for g, k in idx])
      for (g, k), v in zip(idx, z):
        b[p, g, k] = v
    return (a * c1).sum() + (b * c2).sum()

  gr, gs = jgrad(ours, argnums=(0, 1))(
    jnp.asarray(rewards, jnp.float32), jnp.asarray(step_r, jnp.float32)
  )
  np.testing.assert_allclose(
    gr, fd_grad(lambda x: ref(x, step_r), rewards), rtol=2e-3, atol=2e-4
  )
  np.testing.assert_allclose(
    gs, fd_grad(lambda x: ref(rewards, x), step_r), rtol=2e-3, atol=2e-4
  )


def test_thor_errors():
  with pytest.raises(ValueError, match="step_groups_PGN must hold integer"):
    T.thor_advantages_of(
      np.ones((1, 2)),
      np.ones((1, 2, 2)),
      np.ones((1, 2, 2)),
      step_groups_PGN=np.ones((1, 2, 2), np.float32),
    )
  with pytest.raises(ValueError, match="step_rewards_PGN must have rank 3"):
    T.thor_advantages_of(np.ones((1, 2)), np.ones((1, 2)), np.ones((1, 2)))
  with pytest.raises(ValueError, match="turn_ids_PGT"):
    T.thor_advantages().prepare(
      rljax.Batch(
        mask_PGT=np.ones((1, 2, 3)), rewards_PG=np.ones((1, 2))
      ).with_extra(
        tool_calls_PG=np.ones((1, 2, 2), np.int32),
        tool_errors_PG=np.zeros((1, 2, 2), np.int32),
      ),
      (),
    )


# ---------------------------------------------------------------------------
# ToolPO.
# ---------------------------------------------------------------------------


def np_toolpo(success, action, mask, calls, valid, scale=False, eps=EPS):
  out = np.zeros(mask.shape)
  for p in range(success.shape[0]):
    idx = [g for g in range(success.shape[1]) if valid[p, g]]
    for vals, coef in [(success, None), (action, calls)]:
      v = vals[p, idx].astype(np.float64)
      a = v - v.mean() if len(v) >= 2 else np.zeros_like(v)
      if scale and len(v) >= 2:
        a = a / (v.std(ddof=1) + eps)
      for g, x in zip(idx, a):
        w = mask[p, g] if coef is None else mask[p, g] * coef[p, g]
        out[p, g] += x * w
  return out


def test_toolpo_hand_worked():
  # A_succ = [.5, -.5]; A_act = [2, 1] - 1.5 = [.5, -.5]; tool-call tokens
  # get A_succ + A_act = [1, -1], other action tokens [.5, -.5].
  mask = np.ones((1, 2, 3))
  calls = np.array([[[0, 1, 1], [1, 0, 0]]])
  got = T.toolpo_advantages_of([[1.0, 0.0]], [[2.0, 1.0]], mask, calls)
  np.testing.assert_allclose(got, [[[0.5, 1, 1], [-1, -0.5, -0.5]]])


@pytest.mark.parametrize("scale", [False, True])
def test_toolpo_matches_numpy_reference_jitted(scale):
  rng = np.random.default_rng(3)
  success = rng.integers(0, 2, (3, 4)).astype(np.float32)
  action = rng.integers(0, 4, (3, 4)).astype(np.float32)
  mask = (rng.random((3, 4, 6)) > 0.3).astype(np.float32)
  calls = (rng.random((3, 4, 6)) > 0.5).astype(np.float32)
  valid = rng.random((3, 4)) > 0.2
  got = jax.jit(lambda *a: T.toolpo_advantages_of(*a, scale_by_std=scale))(
    success, action, mask, calls, valid
  )
  want = np_toolpo(success, action, mask, calls, valid, scale)
  np.testing.assert_allclose(got, want, atol=1e-5)


def test_toolpo_gradient_matches_finite_differences():
  rng = np.random.default_rng(4)
  success, action = rng.normal(size=(2, 3)), rng.normal(size=(2, 3))
  mask = np.ones((2, 3, 4))
  calls = (rng.random((2, 3, 4)) > 0.5).astype(np.float64)
  c = rng.normal(size=(2, 3, 4))
  valid = np.ones((2, 3), bool)
  for scale in [False, True]:
    grad = jgrad(
      lambda a, s=scale: jnp.sum(
        T.toolpo_advantages_of(success, a, mask, calls, scale_by_std=s) * c
      )
    )(jnp.asarray(action, jnp.float32))
    want = fd_grad(
      lambda a, s=scale: (
        np_toolpo(success, a, mask, calls, valid, s) * c
      ).sum(),
      action,
    )
    np.testing.assert_allclose(grad, want, rtol=2e-3, atol=2e-4)


def test_toolpo_stage_adds_to_outcome_advantages():
  # g0 called tools in turns 0 and 2 (2 and 1 successes), g1 in turn 1
  # (failed): R_action = [3, 0] -> A_act = [1.5, -1.5] on those turns.
  calls = [[[2, 0, 1], [0, 1, 0]]]
  errors = [[[0, 0, 0], [0, 1, 0]]]
  batch = agent_batch([[1.0, 0.0]], calls, errors)
  algo = rljax.chain(
    T.group_advantages(advantages.dr_grpo), T.toolpo_advantages()
  )
  out, _ = algo.prepare(batch, algo.init())
  want = [
    [2.0, 2.0, 0, 0, 0.5, 0, 2.0, 2.0, 0, 0],
    [-0.5, 0, -2.0, -2.0, 0, 0, 0, 0, 0, 0],
  ]
  np.testing.assert_allclose(out.advantages_PGT[0], want, atol=1e-6)
  with pytest.raises(ValueError, match="chain an outcome advantage stage"):
    T.toolpo_advantages().prepare(batch, ())


# ---------------------------------------------------------------------------
# InfoPO.
# ---------------------------------------------------------------------------


def np_ig(logp, cf, ids, mask, n):
  ig = np.zeros(ids.shape[:2] + (n,))
  ok = np.zeros(ig.shape, bool)
  for p, g in np.ndindex(ids.shape[:2]):
    for t in range(n - 1):
      act_t = [
        s for s in range(ids.shape[2]) if ids[p, g, s] == t and mask[p, g, s]
      ]
      obs = [
        s
        for s in range(ids.shape[2])
        if ids[p, g, s] == t and not mask[p, g, s]
      ]
      nxt = [
        s
        for s in range(ids.shape[2])
        if ids[p, g, s] == t + 1 and mask[p, g, s]
      ]
      if act_t and obs and nxt:
        ig[p, g, t] = np.mean([logp[p, g, s] - cf[p, g, s] for s in nxt])
        ok[p, g, t] = True
  return ig, ok


def np_infopo(r, ig, ok, ids, mask, valid, beta, tau=0.5, floor=1.0):
  """The official code's `compute_info_grpo_advantage`, with loops."""
  p_size, g_size, t_size = mask.shape
  mask = mask * valid[..., None]
  a_out = np_grpo(r, valid)[..., None] * mask
  r_int = np.zeros(mask.shape)
  has = np.zeros(mask.shape, bool)
  for p, g in np.ndindex(p_size, g_size):
    for t in range(ig.shape[-1]):
      toks = [s for s in range(t_size) if ids[p, g, s] == t and mask[p, g, s]]
      if ok[p, g, t] and toks:
        r_int[p, g, toks] = ig[p, g, t] / len(toks)
        has[p, g, toks] = True
  a_int = np.zeros(mask.shape)
  for p in range(p_size):
    vals = r_int[p][has[p]]
    if len(vals) >= 2:
      a_int[p][has[p]] = (vals - vals.mean()) / (vals.std(ddof=1) + EPS)
  on = mask > 0
  s_out = a_out[on].std(ddof=1) + EPS
  s_int = a_int[on].std(ddof=1) + EPS
  rho = min(1.0, max(s_out, floor) / s_int)
  out = np.zeros(mask.shape)
  for p in range(p_size):
    rv = r[p][valid[p]]
    std = rv.std(ddof=1) if len(rv) >= 2 else 1.0
    gate = 1 / (1 + math.exp(std / tau))
    out[p] = a_out[p] + beta * gate * rho * a_int[p]
  return out


def test_infopo_information_gain_hand_worked():
  # g0: action 1 (1 token) gains .3 -> IG_0 = .3 (credited to action 0);
  # action 2 (2 tokens) gains .2 and .6 -> IG_1 = .4. g1: IG_0 = mean of
  # action 1's tokens (1.0, -.5) = .25; turn 1 has no next action.
  logp = np.zeros((1, 2, 10), np.float32)
  cf = np.zeros((1, 2, 10), np.float32)
  cf[0, 0, [4, 6, 7]] = [-0.3, -0.2, -0.6]
  cf[0, 1, [2, 3]] = [-1.0, 0.5]
  ig, ok = T.infopo_information_gain(logp, cf, TURN_IDS, ACTIONS, num_turns=3)
  np.testing.assert_allclose(ig, [[[0.3, 0.4, 0], [0.25, 0, 0]]], atol=1e-6)
  np.testing.assert_array_equal(ok, [[[1, 1, 0], [1, 0, 0]]])


def test_infopo_fusion_hand_worked():
  # R = [1, 1]: A_out = 0, the group's std 0 -> gate sigmoid(0) = .5.
  # IG_0: g0 .4 over 2 tokens (.2 each), g1 1.0 over 1 token: token values
  # [.2, .2, 1.0], mean .4666667, unbiased std .4618802 ->
  # A_int = [-.5773503, -.5773503, 1.1547005]. s_out = eps -> target 1;
  # s_int over the 5 action tokens [-.577, -.577, 1.155, 0, 0]: sum of
  # squares 2, /4 -> .7071068; rho = min(1, 1/.7071) = 1.
  # A = beta g rho A_int (beta .5) = [-.1443376, -.1443376, .2886751].
  ids = np.array([[[0, 0, 0, 1], [0, 0, 1, -1]]], np.int32)
  mask = np.array([[[1, 1, 0, 1], [1, 0, 1, 0]]], np.float32)
  ig = np.array([[[0.4, 0.0], [1.0, 0.0]]], np.float32)
  ok = np.array([[[1, 0], [1, 0]]], bool)
  got = T.infopo_advantages_of([[1.0, 1.0]], ig, ok, ids, mask)
  np.testing.assert_allclose(
    got, [[[-0.1443376, -0.1443376, 0, 0], [0.2886751, 0, 0, 0]]], atol=1e-6
  )


def random_episodes(rng, p_size, g_size, t_size, n):
  """Random turn ids (actions then observations, turns in order) and
  action masks."""
  ids = np.full((p_size, g_size, t_size), -1, np.int32)
  mask = np.zeros((p_size, g_size, t_size), np.float32)
  for p, g in np.ndindex(p_size, g_size):
    s = 0
    for t in range(rng.integers(1, n + 1)):
      a, o = rng.integers(1, 4), rng.integers(0, 3)
      ids[p, g, s : s + a + o] = t
      mask[p, g, s : s + a] = 1
      s += a + o
      if s >= t_size:
        break
  ids, mask = ids[..., :t_size], mask[..., :t_size]
  return ids, mask


def test_infopo_matches_numpy_reference_jitted():
  rng = np.random.default_rng(5)
  p_size, g_size, t_size, n = 3, 4, 24, 4
  ids, mask = random_episodes(rng, p_size, g_size, t_size, n)
  logp = rng.normal(size=mask.shape).astype(np.float32)
  cf = rng.normal(size=mask.shape).astype(np.float32)
  got_ig, got_ok = jax.jit(
    lambda *a: T.infopo_information_gain(*a, num_turns=n)
  )(logp, cf, ids, mask)
  ig, ok = np_ig(logp, cf, ids, mask, n)
  np.testing.assert_allclose(got_ig, ig, atol=1e-5)
  np.testing.assert_array_equal(got_ok, ok)
  r = rng.integers(0, 2, (p_size, g_size)).astype(np.float32)
  r[0] = 1.0  # a group with equal outcomes: gate .5
  valid = rng.random((p_size, g_size)) > 0.1
  # Equal outcomes (A_out = 0) and a floor of .05 make the magnitude cap
  # bind (rho = .05 / s_int < 1).
  ones = np.ones_like(r)
  uncapped = np_infopo(ones, ig, ok, ids, mask, valid, 2.0, floor=100.0)
  capped = np_infopo(ones, ig, ok, ids, mask, valid, 2.0, floor=0.05)
  assert np.abs(capped).max() < 0.5 * np.abs(uncapped).max()
  for rewards, beta, floor in [(r, 0.5, 1.0), (ones, 2.0, 0.05)]:
    got = jax.jit(
      lambda *a, b=beta, f=floor: T.infopo_advantages_of(
        *a, beta=b, baseline_std=f
      )
    )(rewards, ig, ok, ids, mask, valid)
    want = np_infopo(rewards, ig, ok, ids, mask, valid, beta, floor=floor)
    np.testing.assert_allclose(got, want, atol=1e-5)


def test_infopo_gradients_match_finite_differences():
  rng = np.random.default_rng(6)
  ids, mask = random_episodes(rng, 2, 3, 16, 3)
  logp = rng.normal(size=mask.shape)
  cf = rng.normal(size=mask.shape)
  ig, ok = np_ig(logp, cf, ids, mask, 3)
  r = rng.normal(size=(2, 3))
  c = rng.normal(size=mask.shape)
  valid = np.ones((2, 3), bool)
  # In the IG (linear in the log-probs) and in the fusion (through A_out).
  g_ig = jgrad(
    lambda x: jnp.sum(
      T.infopo_information_gain(x, cf, ids, mask, num_turns=3)[0]
    )
  )(jnp.asarray(logp, jnp.float32))
  np.testing.assert_allclose(
    g_ig,
    fd_grad(lambda x: np_ig(x, cf, ids, mask, 3)[0].sum(), logp),
    atol=1e-4,
  )
  g_r = jgrad(
    lambda x: jnp.sum(T.infopo_advantages_of(x, ig, ok, ids, mask) * c)
  )(jnp.asarray(r, jnp.float32))
  want = fd_grad(
    lambda x: (np_infopo(x, ig, ok, ids, mask, valid, 0.5) * c).sum(), r
  )
  np.testing.assert_allclose(g_r, want, rtol=2e-3, atol=2e-4)


def test_infopo_stage_and_decay():
  logp = np.zeros((1, 2, 10), np.float32)
  cf = np.zeros((1, 2, 10), np.float32)
  cf[0, 0, [4, 6, 7]] = [-0.3, -0.2, -0.6]
  cf[0, 1, [2, 3]] = [-1.0, 0.5]
  batch = agent_batch(
    [[1.0, 0.0]],
    np.zeros((1, 2, 3)),
    np.zeros((1, 2, 3)),
    infopo_cf_logp_PGT=cf,
  )._replace(old_logp_PGT=logp)
  stage = T.infopo_advantages(num_turns=3, beta=0.5, decay=1.0)
  state = stage.init()
  ig, ok = T.infopo_information_gain(logp, cf, TURN_IDS, ACTIONS, num_turns=3)
  for k in range(2):
    out, state = stage.prepare(batch, state)
    want = T.infopo_advantages_of(
      [[1.0, 0.0]], ig, ok, TURN_IDS, ACTIONS, beta=0.5 * math.exp(-k)
    )
    np.testing.assert_allclose(out.advantages_PGT, want, atol=1e-6)
  assert int(state.step) == 2
  with pytest.raises(ValueError, match="infopo_cf_logp_PGT"):
    T.infopo_advantages(num_turns=3).prepare(
      agent_batch(
        [[1.0, 0.0]], np.zeros((1, 2, 3)), np.zeros((1, 2, 3))
      )._replace(old_logp_PGT=logp),
      state,
    )


_CONFIG = ModelConfig(
  vocab_size=32,
  hidden_size=16,
  intermediate_size=32,
  num_layers=1,
  num_heads=2,
  num_kv_heads=1,
  head_dim=8,
)


def test_infopo_counterfactual_pass_matches_rebuilt_sequences():
  model = testing.random_model(_CONFIG, seed=0)
  rng = np.random.default_rng(7)
  s, t = 3, 10
  tokens = rng.integers(1, 32, (2, s + t)).astype(np.int32)
  mask = np.ones((2, s + t), np.int32)
  mask[1, 0] = 0  # a left-padded prompt
  ids, act = TURN_IDS[0], ACTIONS[0]
  mask[:, s:] = ids >= 0
  placeholder = [5, 6, 7]
  run = testing.jit_model_fn(
    lambda m, *a: T.infopo_counterfactual_logprobs(
      m, *a, placeholder_ids=placeholder, num_turns=3
    )
  )
  logp, cf = run(model, tokens, mask, ids, act)
  # Reference: rebuild each counterfactual row by hand and score it.
  rows, where = [], []
  for b in range(2):
    for k in range(1, 3):
      obs = [j for j in range(t) if ids[b, j] == k - 1 and not act[b, j]]
      row = tokens[b].copy()
      for rank, j in enumerate(obs):  # cut or repeat the last token
        row[s + j] = placeholder[min(rank, len(placeholder) - 1)]
      rows.append(row[None])
      where.append((b, k))
  score = testing.jit_model_fn(lambda m, x, y: token_logprobs(m, x, y)[0])
  full = np.asarray(score(model, tokens, mask))
  np.testing.assert_allclose(logp, full[:, s:], atol=1e-5)
  want = full[:, s:].copy()
  for row, (b, k) in zip(rows, where):
    scored = np.asarray(score(model, row, mask[b][None]))
    for j in range(t):
      if ids[b, j] == k and act[b, j]:
        want[b, j] = scored[0, s + j]
  np.testing.assert_allclose(cf, want, atol=1e-5)
  # g0's observation 0 has 2 tokens (placeholder cut), g1's 1: the next
  # actions' log-probs change.
  assert not np.allclose(cf[0, 4], logp[0, 4])
  assert not np.allclose(cf[1, 2], logp[1, 2])


def test_infopo_errors():
  with pytest.raises(ValueError, match="placeholder_ids is empty"):
    T.infopo_counterfactual_logprobs(
      None,
      np.ones((1, 4), np.int32),
      np.ones((1, 4)),
      np.zeros((1, 2), np.int32),
      np.ones((1, 2)),
      [],
      num_turns=2,
    )
  with pytest.raises(ValueError, match="num_turns"):
    T.infopo_information_gain(
      np.zeros((1, 1, 2)),
      np.zeros((1, 1, 2)),
      np.zeros((1, 1, 2), np.int32),
      np.ones((1, 1, 2)),
      num_turns=0,
    )
  with pytest.raises(ValueError, match="turn_ids_PGT must hold integer"):
    T.infopo_information_gain(
      np.zeros((1, 1, 2)),
      np.zeros((1, 1, 2)),
      np.zeros((1, 1, 2)),
      np.ones((1, 1, 2)),
      num_turns=2,
    )


# ---------------------------------------------------------------------------
# PORTool.
# ---------------------------------------------------------------------------

# g0: A -> n0, g1: A -> n1, g2: B -> n2, g3: B (ended after one step).
HAND_TREE = np.array([[[0, 0], [0, 1], [1, 2], [1, -1]]], np.int32)


def np_portool_steps(correct, tree, tool_ok, valid, w=0.1, desc="any"):
  out = np.zeros(tree.shape)
  for p in range(tree.shape[0]):
    for k in range(tree.shape[2]):
      nodes = {}
      for g in range(tree.shape[1]):
        if valid[p, g] and tree[p, g, k] >= 0:
          nodes.setdefault(tree[p, g, k], []).append(g)
      for members in nodes.values():
        c = [correct[p, g] for g in members]
        reach = max(c) if desc == "any" else np.mean(c)
        ok = np.mean([tool_ok[p, g, k] for g in members])
        out[p, members, k] = reach + w * ok
  return out


def np_portool(rewards, steps, tree, valid, normalize="std", eps=EPS):
  a_traj = np_grpo(rewards, valid, eps)
  fork = np.zeros(tree.shape)
  for p in range(tree.shape[0]):
    for k in range(tree.shape[2]):
      nodes = {}  # node -> (parent, samples)
      for g in range(tree.shape[1]):
        if valid[p, g] and tree[p, g, k] >= 0:
          parent = tree[p, g, k - 1] if k else -7
          nodes.setdefault(tree[p, g, k], (parent, []))[1].append(g)
      value = {
        n: np.mean([steps[p, g, k] for g in gs]) for n, (_, gs) in nodes.items()
      }
      for node, (parent, members) in nodes.items():
        sibs = [n for n, (q, _) in nodes.items() if q == parent]
        if len(sibs) < 2:
          continue
        v = np.array([value[n] for n in sibs])
        a = value[node] - v.mean()
        if normalize == "std":
          a /= v.std(ddof=1) + eps
        fork[p, members, k] = a
  return a_traj, fork


def test_portool_hand_worked():
  # correct = [1, 0, 0, 1]; tool calls all succeeded but g1's second step.
  # Step rewards (any, w = .1): A = 1 + .1 (g0 correct), B = 1 + .1 (g3
  # correct); n0 = 1.1, n1 = 0 + 0 = 0, n2 = 0 + .1 = .1.
  correct = np.array([[1.0, 0.0, 0.0, 1.0]])
  tool_ok = np.array([[[1, 1], [1, 0], [1, 1], [1, 0]]], np.float32)
  steps = T.portool_step_rewards_of(correct, HAND_TREE, tool_ok)
  np.testing.assert_allclose(
    steps, [[[1.1, 1.1], [1.1, 0.0], [1.1, 0.1], [1.1, 0.0]]], atol=1e-6
  )
  # Forks: step 0 siblings A, B (1.1 each) -> 0. Step 1 under A: n0 1.1,
  # n1 0, mean .55 -> +-.55; under B only n2 -> 0.
  a_traj, fork = T.portool_advantages_of(
    correct, steps, HAND_TREE, normalize="mean"
  )
  np.testing.assert_allclose(fork, [[[0, 0.55], [0, -0.55], [0, 0], [0, 0]]])
  # std: sqrt(2 * .55^2) = .7778175 -> +-.7071068. A_traj = +-.8660254.
  _, fork = T.portool_advantages_of(correct, steps, HAND_TREE)
  np.testing.assert_allclose(fork[0, :2, 1], [0.7071068, -0.7071068], 1e-5)
  np.testing.assert_allclose(
    a_traj, [[0.8660254, -0.8660254, -0.8660254, 0.8660254]], atol=1e-5
  )
  # "mean" descendants: A = .5 + .1, B = .5 + .1.
  steps = T.portool_step_rewards_of(
    correct, HAND_TREE, tool_ok, descendants="mean"
  )
  np.testing.assert_allclose(steps[0, :, 0], [0.6] * 4, atol=1e-6)


def random_tool_trees(rng, p_size, g_size, n, branch=2):
  tree = np.full((p_size, g_size, n), -1, np.int32)
  for p, g in np.ndindex(p_size, g_size):
    node = 0
    for k in range(rng.integers(1, n + 1)):
      node = node * branch + rng.integers(branch)
      tree[p, g, k] = node
  return tree


@pytest.mark.parametrize("normalize", ["std", "mean"])
@pytest.mark.parametrize("desc", ["any", "mean"])
def test_portool_matches_numpy_reference_jitted(normalize, desc):
  rng = np.random.default_rng(8)
  shape = (3, 8, 3)
  tree = random_tool_trees(rng, *shape)
  correct = rng.integers(0, 2, shape[:2]).astype(np.float32)
  tool_ok = rng.integers(0, 2, shape).astype(np.float32)
  valid = rng.random(shape[:2]) > 0.2
  steps = jax.jit(
    lambda *a: T.portool_step_rewards_of(*a, tool_weight=0.3, descendants=desc)
  )(correct, tree, tool_ok, valid)
  want_steps = np_portool_steps(correct, tree, tool_ok, valid, 0.3, desc)
  np.testing.assert_allclose(steps, want_steps, atol=1e-6)
  got = jax.jit(lambda *a: T.portool_advantages_of(*a, normalize=normalize))(
    correct, steps, tree, valid
  )
  want = np_portool(correct, want_steps, tree, valid, normalize)
  np.testing.assert_allclose(got[0], want[0], atol=1e-5)
  np.testing.assert_allclose(got[1], want[1], atol=1e-4)


def test_portool_gradients_match_finite_differences():
  rng = np.random.default_rng(9)
  tree = random_tool_trees(rng, 2, 6, 3)
  rewards = rng.normal(size=(2, 6))
  steps = rng.normal(size=(2, 6, 3))
  c1, c2 = rng.normal(size=(2, 6)), rng.normal(size=(2, 6, 3))
  valid = np.ones((2, 6), bool)

  def ref(r, s):
    a, b = np_portool(r, s, tree, valid)
    return (a * c1).sum() + (b * c2).sum()

  gr, gs = jgrad(
    lambda r, s: sum(
      jnp.sum(x * c)
      for x, c in zip(T.portool_advantages_of(r, s, tree), (c1, c2))
    ),
    argnums=(0, 1),
  )(jnp.asarray(rewards, jnp.float32), jnp.asarray(steps, jnp.float32))
  np.testing.assert_allclose(
    gr, fd_grad(lambda x: ref(x, steps), rewards), rtol=2e-3, atol=2e-4
  )
  np.testing.assert_allclose(
    gs, fd_grad(lambda x: ref(rewards, x), steps), rtol=2e-3, atol=5e-4
  )


def test_portool_stage():
  # g0: steps n0 (turn 0) -> n1 (turn 1) -> n2, g1: n0 -> n3: the fork
  # after turn 0. g1's second call failed. correct = [1, 0].
  tree = np.array([[[0, 1, 2], [0, 3, -1]]], np.int32)
  calls = [[[1, 1, 1], [1, 1, 0]]]
  errors = [[[0, 0, 0], [0, 1, 0]]]
  batch = agent_batch([[1.0, 0.0]], calls, errors, node_ids_PG=tree)
  out, _ = T.portool_advantages(coef=2.0, normalize="mean").prepare(batch, ())
  # Step rewards: n0 = 1.1; n1 = 1.1, n3 = 0 -> fork +-.55, times coef 2.
  a = 0.7071068
  want = [
    [a, a, 0, 0, a + 1.1, 0, a, a, 0, 0],
    [-a, 0, -a - 1.1, -a - 1.1, 0, 0, 0, 0, 0, 0],
  ]
  np.testing.assert_allclose(out.advantages_PGT[0], want, atol=1e-5)


def test_portool_errors():
  with pytest.raises(ValueError, match="tree_PGN must hold integer"):
    T.portool_advantages_of(
      np.ones((1, 2)), np.ones((1, 2, 2)), np.ones((1, 2, 2), np.float32)
    )
  with pytest.raises(ValueError, match="normalize"):
    T.portool_advantages(normalize="batch")
  with pytest.raises(ValueError, match="node_ids_PG"):
    T.portool_advantages().prepare(
      agent_batch([[1.0, 0.0]], np.zeros((1, 2, 3)), np.zeros((1, 2, 3))), ()
    )


def test_stages_run_under_jit():
  calls = np.array([[[1, 1, 1], [1, 1, 0]]], np.int32)
  errors = np.array([[[0, 0, 0], [0, 1, 0]]], np.int32)
  cf = np.zeros((1, 2, 10), np.float32)
  cf[0, 0, 4] = -1.0
  batch = agent_batch(
    [[1.0, 0.0]],
    calls,
    errors,
    node_ids_PG=np.array([[[0, 1, 2], [0, 3, -1]]], np.int32),
    turn_rewards_PG=np.zeros((1, 2, 3), np.float32),
    infopo_cf_logp_PGT=cf,
  )._replace(old_logp_PGT=np.zeros((1, 2, 10), np.float32))
  stages = [
    T.otc_rewards(),
    T.thor_advantages(),
    rljax.chain(T.group_advantages(advantages.dr_grpo), T.toolpo_advantages()),
    T.infopo_advantages(),
    T.portool_advantages(),
  ]
  for stage in stages:
    state = stage.init()
    eager, _ = stage.prepare(batch, state)
    jitted, _ = jax.jit(stage.prepare)(batch, state)
    for field in ("rewards_PG", "advantages_PGT"):
      if getattr(eager, field) is not None:
        np.testing.assert_allclose(
          getattr(jitted, field), getattr(eager, field), atol=1e-6
        )
    assert np.all(np.isfinite(np.asarray(jitted.rewards_PG)))
