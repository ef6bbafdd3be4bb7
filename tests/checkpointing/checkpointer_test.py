"""Checkpointer: exact round trips, keep-N, save_every, async, atomicity,
resharding on restore, grain iterator resumption and error messages."""

import os
import shutil
import subprocess
import sys
import textwrap

import grain
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P
from jax.sharding import SingleDeviceSharding
import numpy as np
import optax
import pytest

from rljax.checkpointing import Checkpointer
from rljax.checkpointing import data_to_keys
from rljax.checkpointing import keys_to_data


def _bits(x):
  """The raw bits of an array (typed keys as key data), for exact equality."""
  if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key):
    x = jax.random.key_data(x)
  x = np.asarray(x)
  return x.view(f"u{x.dtype.itemsize}") if x.dtype.itemsize > 1 else x


def _assert_bitwise_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    if isinstance(x, jax.Array | np.ndarray):
      assert x.dtype == y.dtype and x.shape == y.shape
      np.testing.assert_array_equal(_bits(x), _bits(y))
    else:
      assert type(x) is type(y) and x == y


def _abstract(tree):
  return jax.tree.map(
    lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding),
    tree,
  )


def _train_state():
  """params (f32/bf16/int), adam state after one update, a key and a step."""
  key = jax.random.key(7)
  params = {
    "w": jax.random.normal(key, (4, 3), jnp.float32),
    "e": jax.random.normal(key, (5, 2)).astype(jnp.bfloat16),
    "ids": jnp.arange(6, dtype=jnp.int32).reshape(2, 3),
  }
  float_params = {"w": params["w"], "e": params["e"]}
  opt = optax.adam(1e-2)
  opt_state = opt.init(float_params)
  grads = jax.tree.map(lambda p: jnp.full_like(p, 0.1), float_params)
  _, opt_state = opt.update(grads, opt_state, float_params)
  return {
    "params": params,
    "opt_state": opt_state,
    "rng": jax.random.split(jax.random.key(3), 2)[1],
    "rbg": jax.random.key(5, impl="rbg"),
    "step": jnp.asarray(11, jnp.int32),
  }


def test_round_trip_is_bitwise_exact(tmp_path):
  state = _train_state()
  data_state = {"next_index": 17, "np": np.int64(3), "raw": b"\x00\xffgrain"}
  metadata = {"algo": "grpo", "lr": 2e-4, "layers": [2, 4]}
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.save(11, state, data_state=data_state, metadata=metadata)
    ckpt.wait()
    out = ckpt.restore(_abstract(state))
  assert out.step == 11
  _assert_bitwise_equal(out.state, state)
  assert isinstance(out.state["opt_state"][0], optax.ScaleByAdamState)
  assert jax.random.key_impl(out.state["rbg"]) == jax.random.key_impl(
    state["rbg"]
  )
  # numpy scalars come back as Python scalars; bytes stay bytes.
  assert out.data_state == {"next_index": 17, "np": 3, "raw": b"\x00\xffgrain"}
  assert out.metadata == metadata


def test_restore_from_concrete_arrays_and_numpy_leaves(tmp_path):
  state = {
    "x": jnp.arange(3.0),
    "table": np.arange(4),
    "count": 2,
    "seen": np.int64(12),
  }
  with Checkpointer(tmp_path, async_save=False) as ckpt:
    ckpt.save(0, state)
    like = {
      "x": jnp.zeros(3),
      "table": np.zeros(4, np.int64),
      "count": 0,
      "seen": np.int64(0),
    }
    out = ckpt.restore(like)
  np.testing.assert_array_equal(out.state["x"], [0.0, 1.0, 2.0])
  np.testing.assert_array_equal(out.state["table"], [0, 1, 2, 3])
  assert out.state["count"] == 2
  assert type(out.state["seen"]) is np.int64 and out.state["seen"] == 12
  assert out.data_state is None and out.metadata is None


def test_keep_two_keeps_the_last_two(tmp_path):
  with Checkpointer(tmp_path, keep=2) as ckpt:
    for step in range(5):
      assert ckpt.save(step, {"x": jnp.full((2,), step)})
    ckpt.wait()
    assert ckpt.all_steps() == [3, 4]
    assert ckpt.latest_step() == 4
  assert sorted(p for p in os.listdir(tmp_path) if p.isdigit()) == ["3", "4"]


def test_save_every_and_force(tmp_path):
  with Checkpointer(tmp_path, keep=None, save_every=3) as ckpt:
    saved = [ckpt.save(step, {"x": jnp.ones(2)}) for step in range(8)]
    assert saved == [True, False, False, True, False, False, True, False]
    assert ckpt.save(7, {"x": jnp.ones(2)}, force=True)
    # A step not after the latest is never saved, not even with force.
    assert not ckpt.save(6, {"x": jnp.ones(2)})
    assert not ckpt.save(5, {"x": jnp.ones(2)}, force=True)
    assert not ckpt.save(7, {"x": jnp.ones(2)}, force=True)
    ckpt.wait()
    assert ckpt.all_steps() == [0, 3, 6, 7]


def test_async_save_survives_deleting_the_source_then_restores(tmp_path):
  x = jax.random.normal(jax.random.key(0), (512, 256))
  expected = np.asarray(x)
  ckpt = Checkpointer(tmp_path, async_save=True)
  assert ckpt.save(1, {"x": x})
  # The next train step would donate the buffers; the save must not need them.
  x.delete()
  ckpt.wait()
  ckpt.close()
  like = {
    "x": jax.ShapeDtypeStruct(
      expected.shape,
      expected.dtype,
      sharding=SingleDeviceSharding(jax.devices()[0]),
    )
  }
  with Checkpointer(tmp_path) as fresh:
    assert fresh.latest_step() == 1
    np.testing.assert_array_equal(fresh.restore(like).state["x"], expected)


def test_leftover_tmp_directory_is_ignored_and_cleaned(tmp_path):
  state = {"x": jnp.arange(4.0)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(1, state)
  # A save of step 2 that died before orbax's final rename: all its files are
  # there, under orbax's tmp name.
  tmp = tmp_path / "2.orbax-checkpoint-tmp"
  shutil.copytree(tmp_path / "1", tmp)
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 1
    assert ckpt.all_steps() == [1]
    out = ckpt.restore(_abstract(state))
    assert out.step == 1
    ckpt.save(2, {"x": jnp.arange(4.0) + 1})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2]
  assert not tmp.exists()


_KILLED_SAVE = """
import glob, os, sys, time
import jax.numpy as jnp
from rljax.checkpointing import Checkpointer
root = sys.argv[1]
ckpt = Checkpointer(root, async_save=True)
ckpt.save(1, {"x": jnp.zeros((4096, 4096))})
ckpt.wait()
ckpt.save(2, {"x": jnp.ones((4096, 4096))})
deadline = time.time() + 30
while not glob.glob(os.path.join(root, "2.orbax-checkpoint-tmp*")):
  assert time.time() < deadline, "the step-2 save never started"
os._exit(0)  # killed while orbax writes step 2 into its tmp directory
"""


def test_save_killed_mid_way_leaves_no_visible_checkpoint(tmp_path):
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  subprocess.run(
    [sys.executable, "-c", textwrap.dedent(_KILLED_SAVE), str(tmp_path)],
    check=True,
    env=env,
    timeout=120,
  )
  (leftover,) = tmp_path.glob("2.orbax-checkpoint-tmp*")
  assert not (tmp_path / "2").exists()
  one = SingleDeviceSharding(jax.devices()[0])
  like = {"x": jax.ShapeDtypeStruct((4096, 4096), jnp.float32, sharding=one)}
  with Checkpointer(tmp_path) as ckpt:
    assert ckpt.latest_step() == 1
    assert float(ckpt.restore(like).state["x"].sum()) == 0.0
    ckpt.save(2, {"x": jnp.ones((4096, 4096))})
    ckpt.wait()
    assert ckpt.all_steps() == [1, 2]
    assert float(ckpt.restore(like).state["x"].sum()) == 4096 * 4096
  assert not leftover.exists()


def test_restore_from_eight_devices_onto_one(tmp_path):
  mesh = jax.make_mesh((8,), ("data",))
  sharding = NamedSharding(mesh, P("data"))
  w = jax.device_put(jnp.arange(32.0).reshape(8, 4), sharding)
  keys = jax.device_put(jax.random.split(jax.random.key(1), 8), sharding)
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(0, {"w": w, "keys": keys})
    one = SingleDeviceSharding(jax.devices()[0])
    like = {
      "w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=one),
      "keys": jax.ShapeDtypeStruct(keys.shape, keys.dtype, sharding=one),
    }
    out = ckpt.restore(like).state
  assert out["w"].sharding == one and out["keys"].sharding == one
  _assert_bitwise_equal(out, {"w": w, "keys": keys})


def test_restore_from_one_device_onto_a_2x4_mesh(tmp_path):
  w = jnp.arange(64.0).reshape(8, 8)
  key = jax.random.split(jax.random.key(2), 4)
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(0, {"w": w, "keys": key})
    mesh = jax.make_mesh((2, 4), ("data", "fsdp"))
    ws = NamedSharding(mesh, P("data", "fsdp"))
    ks = NamedSharding(mesh, P("fsdp"))
    like = {
      "w": jax.ShapeDtypeStruct(w.shape, w.dtype, sharding=ws),
      "keys": jax.ShapeDtypeStruct(key.shape, key.dtype, sharding=ks),
    }
    out = ckpt.restore(like).state
  assert out["w"].sharding == ws and out["keys"].sharding == ks
  assert out["w"].addressable_shards[0].data.shape == (4, 2)
  _assert_bitwise_equal(out, {"w": w, "keys": key})


def _dataset():
  return grain.MapDataset.range(100).shuffle(seed=0).batch(4).to_iter_dataset()


def test_grain_iterator_resumes_with_no_skip_and_no_replay(tmp_path):
  straight = [next(it).tolist() for it in [iter(_dataset())] for _ in range(8)]
  it = iter(_dataset())
  before = [next(it).tolist() for _ in range(5)]
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(5, {"step": jnp.int32(5)}, data_state=it.get_state())
    ckpt.wait()
  with Checkpointer(tmp_path) as ckpt:
    restored = ckpt.restore({"step": jnp.int32(0)})
  resumed = iter(_dataset())
  resumed.set_state(restored.data_state)
  after = [next(resumed).tolist() for _ in range(3)]
  assert before + after == straight
  assert after[0] != before[-1]


def test_data_state_of_another_process_count_is_a_clear_error(tmp_path):
  state = {"x": jnp.ones(2)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(0, state, data_state={"next_index": 3})
  data = tmp_path / "0" / "data"
  os.rename(data / "process_0-of-1.json", data / "process_1-of-2.json")
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(ValueError, match="process_1-of-2.json.*restore_data"):
      ckpt.restore(_abstract(state))
    assert ckpt.restore(_abstract(state), restore_data=False).data_state is None


def test_restore_from_an_empty_directory_names_it(tmp_path):
  with Checkpointer(tmp_path / "run") as ckpt:
    with pytest.raises(
      FileNotFoundError, match="No checkpoint exists in .*run"
    ):
      ckpt.restore({"x": jnp.ones(2)})


def test_restore_of_a_missing_step_lists_the_saved_ones(tmp_path):
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(4, {"x": jnp.ones(2)})
    with pytest.raises(FileNotFoundError, match=r"step 3 .* \[4\]"):
      ckpt.restore({"x": jnp.ones(2)}, step=3)


def test_structure_mismatch_names_the_first_differing_key_path(tmp_path):
  state = {"params": {"a": jnp.ones(2), "b": jnp.ones(3)}, "step": jnp.int32(0)}
  with Checkpointer(tmp_path) as ckpt:
    ckpt.save(0, state)
    renamed = {"params": {"a": jnp.ones(2), "c": jnp.ones(3)}, "step": 0}
    with pytest.raises(
      ValueError, match=r"\['params'\]\['b'\] is in the checkpoint but not"
    ):
      ckpt.restore(renamed)
    extra = {**state, "value": {"w": jnp.ones(1)}}
    with pytest.raises(
      ValueError, match=r"\['value'\]\['w'\] is in abstract_state but not"
    ):
      ckpt.restore(extra)
    reshaped = {"params": {"a": jnp.ones(2), "b": jnp.ones(4)}, "step": 0}
    with pytest.raises(
      ValueError, match=r"\['params'\]\['b'\] has shape \(3,\)"
    ):
      ckpt.restore(reshaped)
    no_sharding = jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype), state
    )
    with pytest.raises(ValueError, match=r"\['params'\]\['a'\] .*sharding="):
      ckpt.restore(no_sharding)


def test_bad_arguments_raise_named_errors(tmp_path):
  with pytest.raises(ValueError, match="keep"):
    Checkpointer(tmp_path, keep=0)
  with pytest.raises(ValueError, match="save_every"):
    Checkpointer(tmp_path, save_every=0)
  with Checkpointer(tmp_path) as ckpt:
    with pytest.raises(
      TypeError, match=r"data_state\['f'\] is a builtin_function"
    ):
      ckpt.save(0, {"x": jnp.ones(2)}, data_state={"f": len})
    with pytest.raises(ValueError, match="step"):
      ckpt.save(-1, {"x": jnp.ones(2)})


def test_key_conversion_keeps_shardings():
  mesh = jax.make_mesh((8,), ("data",))
  sharding = NamedSharding(mesh, P("data"))
  keys = jax.device_put(jax.random.split(jax.random.key(0), 8), sharding)
  tree = {"k": keys, "x": jnp.ones(3)}
  data = keys_to_data(tree)
  assert data["k"].dtype == jnp.uint32 and data["k"].shape == (8, 2)
  assert data["x"] is tree["x"]
  abstract = keys_to_data(_abstract(tree))
  assert abstract["k"].shape == (8, 2)
  assert abstract["k"].sharding == NamedSharding(mesh, P("data", None))
  back = data_to_keys(data, tree)
  assert back["k"].dtype == keys.dtype and back["k"].sharding == sharding
  _assert_bitwise_equal(back, tree)
