"""bfloat16 weights with float32 master weights; the dry run's state bytes."""

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rljax import testing
from rljax._src.errors import UserError
from rljax.training import Trainer
from rljax.training import master_weights
from rljax.training import validate

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


def _adamw():
  return optax.chain(
    optax.clip_by_global_norm(1.0), optax.adamw(1e-2, weight_decay=0.1)
  )


def test_master_weights_step_the_float32_copy_and_round_it():
  rng = np.random.default_rng(0)
  params = {
    "w": jnp.asarray(rng.normal(size=(4, 3)), jnp.bfloat16),
    "b": jnp.asarray(rng.normal(size=(3,)), jnp.bfloat16),
  }
  opt = master_weights(_adamw())
  state = jax.jit(opt.init)(params)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(state.master))
  # Reference: the same AdamW on float32 copies, gradients cast to float32.
  ref_params = jax.tree.map(lambda p: p.astype(jnp.float32), params)
  ref = _adamw()
  ref_state = ref.init(ref_params)
  step = jax.jit(opt.update)
  for i in range(5):
    draw = np.random.default_rng(i)
    grads = {
      k: jnp.asarray(draw.normal(size=p.shape), jnp.bfloat16)
      for k, p in params.items()
    }
    updates, state = step(grads, state, params)
    params = optax.apply_updates(params, updates)
    g32 = jax.tree.map(lambda g: g.astype(jnp.float32), grads)
    ref_updates, ref_state = ref.update(g32, ref_state, ref_params)
    ref_params = optax.apply_updates(ref_params, ref_updates)
    for name in params:
      # Equal up to jit's float fusion (eager reference).
      np.testing.assert_allclose(
        state.master[name], ref_params[name], rtol=1e-6, atol=1e-7
      )
      assert params[name].dtype == jnp.bfloat16
      np.testing.assert_array_equal(
        params[name], state.master[name].astype(jnp.bfloat16)
      )


def test_small_steps_accumulate_in_the_master_copy():
  # A step of 1e-3 on a weight of 1.0 is below bfloat16's resolution there
  # (2**-7): plain bfloat16 AdamW never moves it, the master copy does.
  params = {"w": jnp.ones((2,), jnp.bfloat16)}
  grads = {"w": jnp.ones((2,), jnp.bfloat16)}
  plain = optax.sgd(1e-3)
  plain_params = params
  plain_state = plain.init(plain_params)
  opt = master_weights(optax.sgd(1e-3))
  state = opt.init(params)
  for _ in range(10):
    u, plain_state = plain.update(grads, plain_state, plain_params)
    plain_params = optax.apply_updates(plain_params, u)
    u, state = opt.update(grads, state, params)
    params = optax.apply_updates(params, u)
  np.testing.assert_array_equal(plain_params["w"], 1.0)  # stuck
  np.testing.assert_allclose(state.master["w"], 0.99, rtol=1e-6)
  # bfloat16 numbers in [0.5, 1) are 2**-8 apart: 0.99 lies between
  # 253/256 = 0.98828125 and 254/256 = 0.9921875, nearer the first.
  np.testing.assert_array_equal(params["w"], np.float32(0.98828125))


def test_update_without_params_is_a_clear_error():
  opt = master_weights(optax.sgd(0.1))
  params = {"w": jnp.ones(2, jnp.bfloat16)}
  with pytest.raises(ValueError, match="needs the parameters"):
    opt.update(params, opt.init(params))


@pytest.mark.slow  # default-run time; run with -m slow
def test_bfloat16_run_with_master_weights_and_the_dry_run_bytes(tmp_path):
  def config(directory, *extra):
    return testing.tiny_run_config(
      CONFIGS / "grpo.py",
      directory,
      "train.mesh=(1, 1, 1)",
      "train.steps=1",
      "train.warm_start_steps=0",
      *extra,
    )

  full = Trainer(config(tmp_path / "f32")).dry_run()["train_state_mib"]
  trainer = Trainer(
    config(
      tmp_path / "bf16",
      "model.param_dtype='bfloat16'",
      "optim.master_weights=True",
    )
  )
  params = jax.tree.leaves(trainer.state.policy.params)
  assert all(x.dtype == jnp.bfloat16 for x in params)
  opt_leaves = jax.tree.leaves(trainer.state.policy.opt_state.master)
  assert all(x.dtype == jnp.float32 for x in opt_leaves)
  report = trainer.dry_run()
  mixed = report["train_state_mib"]
  assert np.isfinite(report["metrics"]["loss"])
  # Half the weights' bytes; the optimizer adds a float32 master copy to
  # Adam's two float32 moments.
  np.testing.assert_allclose(mixed["params"], full["params"] / 2, rtol=1e-2)
  np.testing.assert_allclose(
    mixed["optimizer"], full["optimizer"] * 1.5, rtol=1e-2
  )
  summary = trainer.run()
  assert np.isfinite(summary["history"][-1]["loss"])
  state = trainer.state.policy
  for p, m in zip(
    jax.tree.leaves(state.params), jax.tree.leaves(state.opt_state.master)
  ):
    np.testing.assert_array_equal(p, m.astype(jnp.bfloat16))


def test_master_weights_need_low_precision_weights(tmp_path):
  config = testing.tiny_run_config(
    CONFIGS / "grpo.py", tmp_path, "optim.master_weights=True"
  )
  with pytest.raises(UserError, match="optim.master_weights=True.*param_dtype"):
    validate(config)
  bad = testing.tiny_run_config(
    CONFIGS / "grpo.py", tmp_path, "model.param_dtype='float16'"
  )
  with pytest.raises(UserError, match="model.param_dtype='float16'"):
    validate(bad)
