"""Partial rollouts (Kimi k1.5, C3PO++): groups in flight across steps,
the oldest complete ones trained, continued samples exact."""

import json
import pathlib
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rljax import models
from rljax import rollouts
from rljax import sampling
from rljax import testing
from rljax.checkpointing import _json
from rljax.training import Trainer

CONFIG = pathlib.Path(__file__).resolve().parents[2] / "configs" / "grpo.py"
STOP = 3


@pytest.fixture(scope="module")
def model(tiny_model):
  return tiny_model(16)


def _task(n=8):
  train = [{"i": i} for i in range(n)]
  return types.SimpleNamespace(train=train, format_prompt=lambda e: str(e["i"]))


def _prompt(i):
  return [4 + i % 10, 5, 6 + i % 3]


def _draw(strategy, model, ids, state, step, batch=2, budget=6):
  groups = [rollouts.Group({"i": i}, str(i), i, 2) for i in ids]
  engine = sampling.Engine(
    model.config,
    slots=4,
    page_size=4,
    segment=2,
    max_length=16,
    stop_ids=(STOP,),
  )
  return rollouts.Drawn(
    *strategy.draw(
      engine,
      model,
      [_prompt(i) for i in ids],
      np.full(len(ids), 2),
      key=jax.random.key(step),
      max_new_tokens=budget,
      width=budget,
      temperature=1.0,
      groups=groups,
      step=step,
      state=state,
      batch=batch,
    )
  )


def _teacher_forced(model, tokens):
  logp, _ = models.token_logprobs(
    model, jnp.asarray(tokens, jnp.int32)[None], schedule="dense"
  )
  return np.asarray(logp[0, 1:])


def test_pool_carries_unfinished_groups_and_trains_the_oldest(model):
  strategy = rollouts.PartialRollouts(segment=1, in_flight=2).prepare(_task())
  state = strategy.init()
  assert strategy.new_prompts(2, state) == 4  # fill the pool
  out = _draw(strategy, model, [0, 1, 2, 3], state, step=0)
  r = out.rollout
  assert r.tokens_PGT.shape == (2, 2, 6) and len(out.groups) == 2
  lengths = r.mask_PGT.sum(-1)
  # every trained sample is complete: a stop id, or the whole budget
  for i in range(2):
    for j in range(2):
      n = lengths[i, j]
      assert r.tokens_PGT[i, j, n - 1] == STOP or n == 6
      assert r.truncated_PG[i, j] == (r.tokens_PGT[i, j, n - 1] != STOP)
  assert np.all(out.extra["lag_PG"][r.mask_PGT > 0] == 0)
  # the checkpoint's round trip
  state = _json.decode(json.loads(json.dumps(_json.encode(out.state, "s"))))
  held = list(state["ids"])
  assert state["length"].sum() > 0  # paused mid-sample
  assert len(held) == 2 and not set(held) & {g.prompt_id for g in out.groups}
  assert strategy.new_prompts(2, state) == 2
  # Step 1: the groups carried over are older, so they are trained first
  # (they may need more decoding); their step-0 tokens are kept as drawn.
  before = {
    int(i): (state["tokens"][a], state["logp"][a], state["length"][a])
    for a, i in enumerate(state["ids"])
  }
  out1 = _draw(strategy, model, [4, 5], state, step=1)
  assert [g.prompt_id for g in out1.groups] == held
  r1 = out1.rollout
  for i, g in enumerate(out1.groups):
    tokens, logp, length = before[g.prompt_id]
    for j in range(2):
      k = length[j]
      np.testing.assert_array_equal(r1.tokens_PGT[i, j, :k], tokens[j, :k])
      np.testing.assert_array_equal(r1.logp_PGT[i, j, :k], logp[j, :k])
      lag = out1.extra["lag_PG"][i, j]
      assert np.all(lag[:k] == 1) and np.all(
        lag[k : r1.mask_PGT[i, j].sum()] == 0
      )
      # Same weights in both steps: the continued sample's log-probs are
      # the teacher-forced ones of the whole sequence.
      n = r1.mask_PGT[i, j].sum()
      seq = _prompt(g.prompt_id) + r1.tokens_PGT[i, j, :n].tolist()
      tf = _teacher_forced(model, seq)[len(_prompt(g.prompt_id)) - 1 :]
      np.testing.assert_allclose(r1.full_logp_PGT[i, j, :n], tf, atol=1e-4)


def test_in_flight_one_is_plain_sampling(model):
  strategy = rollouts.PartialRollouts(segment=2, in_flight=1).prepare(_task())
  state = strategy.init()
  assert strategy.new_prompts(2, state) == 2
  out = _draw(strategy, model, [0, 1], state, step=0)
  assert [g.prompt_id for g in out.groups] == [0, 1]
  assert len(out.state["ids"]) == 0


@pytest.mark.slow  # default-run time; run with -m slow
def test_max_lag_restarts_stale_groups(model):
  strategy = rollouts.PartialRollouts(segment=1, in_flight=2, max_lag=1)
  strategy = strategy.prepare(_task())
  out = _draw(strategy, model, [0, 1, 2, 3], strategy.init(), step=0)
  state = out.state
  # Pretend the carried tokens were drawn long ago: they are cleared and
  # drawn again, so every trained token is this step's.
  state["drawn_at"] = np.where(state["drawn_at"] >= 0, -5, state["drawn_at"])
  out = _draw(strategy, model, [4, 5], state, step=1)
  r = out.rollout
  assert np.all(out.extra["lag_PG"][r.mask_PGT > 0] == 0)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    ({"segment": 0}, "segment"),
    ({"in_flight": 0.5}, "in_flight"),
    ({"max_lag": 0}, "max_lag"),
  ],
)
def test_bad_input_is_named(kwargs, match):
  with pytest.raises(ValueError, match=match):
    rollouts.PartialRollouts(**kwargs)


@pytest.mark.slow  # minutes of CPU: the slow set
def test_trainer_carries_groups_and_resumes_exactly(tmp_path):
  def trainer():
    config = testing.tiny_run_config(
      CONFIG, tmp_path, "train.steps=3", "output.checkpoint_every=1"
    )
    return Trainer(
      config, groups=rollouts.PartialRollouts(segment=1, in_flight=2)
    )

  first = trainer()
  first.run(steps=2)
  first.checkpointer.wait()
  assert "lag_PG" in first._last.extra
  held = first.groups_state["ids"]
  assert len(held) == first.config.train.prompts_per_step
  resumed = trainer()
  assert resumed.start_step == 2
  for k in ("ids", "tokens", "logp", "length", "done", "drawn_at"):
    np.testing.assert_array_equal(
      resumed.groups_state[k], first.groups_state[k]
    )
  a, b = first.step(2), resumed.step(2)
  assert a["reward"] == b["reward"]
  assert rollouts.get("partial", segment=1).segment == 1


def test_train_unfinished_trains_every_window(model):
  strategy = rollouts.PartialRollouts(
    segment=1, in_flight=1, train_unfinished=True
  ).prepare(_task())
  state = strategy.init()
  out = _draw(strategy, model, [0, 1], state, step=0)
  r = out.rollout
  assert [g.prompt_id for g in out.groups] == [0, 1]
  assert np.all(r.mask_PGT.sum(-1) == 1)  # one window of one token
  ended = r.tokens_PGT[..., 0] == STOP
  np.testing.assert_array_equal(out.extra["unfinished_PG"], ~ended)
  held = list(out.state["ids"])  # groups with a sample still running
  assert held == [i for i in (0, 1) if not ended[i].all()]
  new = strategy.new_prompts(2, out.state)
  assert new == 2 - len(held)
  out1 = _draw(strategy, model, [2, 3][:new], out.state, step=1)
  assert [g.prompt_id for g in out1.groups][: len(held)] == held
  for i in range(len(held)):
    for j in range(2):
      lag = out1.extra["lag_PG"][i, j]
      if ended[held[i], j]:  # ended at step 0 (prompt ids are rows)
        assert out1.rollout.mask_PGT[i, j].sum() == 1 and lag[0] == 1
      else:  # one more token this step
        np.testing.assert_array_equal(lag[:2], [1, 0])


@pytest.mark.slow  # a value model: about 40 s
def test_tppo_and_c3po_configs_train(tmp_path):
  root = CONFIG.parent
  for name in ("tppo", "c3po_pp", "kimi_partial"):
    config = testing.tiny_run_config(
      root / f"{name}.py", tmp_path / name, "train.steps=2"
    )
    summary = Trainer(config).run()
    assert np.isfinite(summary["history"][-1]["loss"])
