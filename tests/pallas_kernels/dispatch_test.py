"""Schedule dispatch: auto, logged fallbacks, and argument errors."""

import inspect
import logging

import jax.numpy as jnp
import numpy as np
import pytest

import pallas_kernels as pk
from pallas_kernels import _dispatch

F32, BF16 = jnp.float32, jnp.bfloat16
HIDDEN = jnp.asarray(np.random.default_rng(0).normal(size=(5, 4)), F32)
UNEMBED = jnp.asarray(np.random.default_rng(1).normal(size=(4, 9)), F32)
TARGETS = jnp.array([0, 3, 8, 2, 2])
TOKENS = jnp.zeros(5)


@pytest.fixture(autouse=True)
def _fresh_warnings():
  """Each test sees every fallback reason as new."""
  _dispatch._WARNED.clear()
  yield
  _dispatch._WARNED.clear()


def _warnings(caplog):
  return [
    r
    for r in caplog.records
    if r.name == "pallas_kernels" and r.levelno == logging.WARNING
  ]


def test_auto_is_chunked_on_cpu_without_a_warning(caplog):
  assert _dispatch.resolve("auto", (F32, F32)).name == "chunked"
  assert inspect.unwrap(
    _dispatch.resolve("auto", (F32, F32), 16, 256).forward
  ).keywords == {
    "block_n": 16,
    "block_v": 256,
  }
  assert not _warnings(caplog)


@pytest.mark.parametrize("backend", ["tpu", "gpu"])
def test_auto_picks_the_backends_kernel(backend, monkeypatch, caplog):
  monkeypatch.setattr(_dispatch, "_backend", lambda: backend)
  sched = _dispatch.resolve("auto", (BF16, BF16))
  assert sched.name == f"pallas_{backend}"
  assert inspect.unwrap(sched.forward).keywords["interpret"] is False
  assert (
    inspect.unwrap(sched.forward).keywords["block_n"],
    inspect.unwrap(sched.forward).keywords["block_v"],
  ) == (pk.DEFAULT_BLOCKS[sched.name])
  assert not _warnings(caplog)


def test_compile_for_chooses_the_targets_kernel(caplog):
  with pk.compile_for("tpu"):
    sched = _dispatch.resolve("auto", (BF16, BF16))
    assert sched.name == "pallas_tpu"
    assert inspect.unwrap(sched.forward).keywords["interpret"] is False
    with pk.compile_for("cpu"):  # nested: the innermost wins
      assert _dispatch.resolve("auto", (F32, F32)).name == "chunked"
    assert _dispatch.resolve("pallas_tpu", (F32, F32)).name == "pallas_tpu"
  assert _dispatch.resolve("auto", (BF16, BF16)).name == "chunked"  # restored
  assert not _warnings(caplog)
  with pytest.raises(ValueError, match=r"one of \['cpu', 'gpu', 'tpu'\]"):
    with pk.compile_for("TPU v5e"):
      pass


def test_tpu_blocks_are_fitted_to_the_target_chips_vmem():
  from pallas_kernels import _pallas_tpu

  mib = 2**20
  # Qwen3-8B's width (4096) in bfloat16, default 512 x 2048 blocks: double-
  # buffered input blocks 2 (512 + 2048) 4096 x 2 B = 40 MiB, output blocks
  # 2 x 2048 x 4096 x 2 B = 32 MiB, float32 tiles 6 x 512 x 2048 x 4 B =
  # 24 MiB, accumulators 2048 x 4096 x 4 B = 32 MiB, and 4 MiB: 132 MiB.
  assert _pallas_tpu._vmem_need(512, 2048, 4096, 2) == 132 * mib
  # A v5e (128 MiB) takes 3/4 = 96 MiB: the vocabulary block halves once,
  # 24 + 16 + 12 + 16 + 4 = 72 MiB. A v5p (64 MiB, 48 usable): twice,
  # 16 + 8 + 6 + 8 + 4 = 42 MiB. A v4 (16 MiB, 12): down to 64 x 128.
  # Each requests its budget (v4: its 16 MiB, the default scoped limit).
  for kind, blocks, vmem in (
    ("TPU v5 lite", (512, 1, 1024, 8), 96),
    ("TPU v5", (512, 1, 512, 16), 48),
    ("TPU v4", (64, 8, 128, 64), 16),
  ):
    with pk.compile_for("tpu", device_kind=kind):
      fitted = _pallas_tpu._fit(512, 8192, 4096, 2, 512, 2048)
    assert fitted == (*blocks, vmem * mib), kind
  # Blocks that fit keep their size: width 192 in float32, 3.75 + 3 + 24 +
  # 1.5 + 4 = 36.25 MiB, within a v5p's budget.
  with pk.compile_for("tpu", device_kind="TPU v5"):
    fitted = _pallas_tpu._fit(700, 3000, 192, 4, 512, 2048)
  assert fitted == (512, 2, 2048, 2, 48 * mib)
  assert _pallas_tpu._vmem_need(512, 2048, 192, 4) == int(36.25 * mib)


def test_pallas_interpret_runs_the_tpu_kernel_interpreted():
  sched = _dispatch.resolve("pallas_interpret", (F32, F32))
  assert sched.name == "pallas_interpret"
  assert (
    inspect.unwrap(sched.backward).func.__module__
    == "pallas_kernels._pallas_tpu"
  )
  assert inspect.unwrap(sched.backward).keywords["interpret"] is True


@pytest.mark.parametrize("schedule", ["pallas_tpu", "pallas_gpu"])
def test_pallas_on_cpu_falls_back_with_exactly_one_warning(schedule, caplog):
  want = pk.token_logprob(HIDDEN, UNEMBED, TARGETS, schedule="chunked")
  for _ in range(3):
    got = pk.token_logprob(HIDDEN, UNEMBED, TARGETS, schedule=schedule)
    np.testing.assert_array_equal(got[0], want[0])
  (record,) = _warnings(caplog)
  assert schedule in record.getMessage() and "cpu" in record.getMessage()


def test_unsupported_dtype_falls_back_before_importing(caplog, monkeypatch):
  monkeypatch.setitem(
    _dispatch._MODULE, "pallas_interpret", "pallas_kernels._absent"
  )
  sched = _dispatch.resolve("pallas_interpret", (jnp.float16, F32))
  assert sched.name == "chunked"
  (record,) = _warnings(caplog)
  assert "float16" in record.getMessage()


def test_missing_kernel_module(caplog, monkeypatch):
  monkeypatch.setattr(_dispatch, "_backend", lambda: "tpu")
  monkeypatch.setitem(_dispatch._MODULE, "pallas_tpu", "pallas_kernels._absent")
  # An explicit request for a kernel that is not installed is an error ...
  with pytest.raises(ModuleNotFoundError, match="schedule='chunked'"):
    _dispatch.resolve("pallas_tpu", (F32, F32))
  # ... while "auto" falls back to chunked and says why, once.
  for _ in range(2):
    assert _dispatch.resolve("auto", (BF16, BF16)).name == "chunked"
  (record,) = _warnings(caplog)
  assert "pallas_kernels._absent" in record.getMessage()


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(hidden_ND=jnp.float32(1.0)), "hidden_ND"),
    (dict(hidden_ND=jnp.zeros((5, 4), jnp.int32)), "hidden_ND"),
    (dict(unembed_DV=jnp.zeros((3, 9))), "unembed_DV"),
    (dict(unembed_DV=jnp.zeros((4, 9, 1))), "unembed_DV"),
    (dict(targets_N=jnp.zeros((4,), jnp.int32)), "targets_N"),
    (dict(targets_N=jnp.zeros((5,))), "targets_N"),
    (dict(temperature=0.0), "temperature"),
    (dict(temperature=jnp.ones(2)), "temperature"),
    (dict(schedule="triton"), r"schedule must be one of \['auto', 'dense'"),
    (dict(block_n=0), "block_n"),
    (dict(block_v=2.5), "block_v"),
  ],
)
def test_token_logprob_bad_arguments(kwargs, match):
  args = dict(hidden_ND=HIDDEN, unembed_DV=UNEMBED, targets_N=TARGETS)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    pk.token_logprob(**args)


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(loss="grpo"), "loss must be one of"),
    (dict(tau_pos=0.0), "tau_pos"),
    (dict(tau_neg=-1.0), "tau_neg"),
    (dict(loss="ppo_clip", eps_low=0.0), "eps_low"),
    (dict(loss="ppo_clip", dual_clip=1.0), "dual_clip"),
    (dict(log_ratio_clamp=0.0), "log_ratio_clamp"),
    (dict(old_logp_N=jnp.zeros(4)), "old_logp_N"),
    (dict(advantages_N=jnp.zeros((5, 1))), "advantages_N"),
    (dict(mask_N=jnp.zeros(6)), "mask_N"),
  ],
)
def test_policy_loss_bad_arguments(kwargs, match):
  args = dict(old_logp_N=TOKENS, advantages_N=TOKENS, mask_N=TOKENS)
  args.update(kwargs)
  with pytest.raises(ValueError, match=match):
    pk.policy_loss(HIDDEN, UNEMBED, TARGETS, **args)


def test_empty_batch_gives_empty_outputs():
  logp, entropy = pk.token_logprob(
    jnp.zeros((0, 4)), UNEMBED, jnp.zeros((0,), jnp.int32)
  )
  assert logp.shape == entropy.shape == (0,)


def test_every_public_symbol_has_a_docstring():
  assert pk.__doc__
  for name in pk.__all__:
    obj = getattr(pk, name)
    if inspect.isfunction(obj) or inspect.isclass(obj):
      assert inspect.getdoc(obj), name


def test_auto_runs_dense_while_the_logits_are_small():
  from pallas_kernels import _api

  def name(tokens):
    hidden = jnp.zeros((tokens, 4), F32)
    return _api._schedule("auto", hidden, UNEMBED, None, None).name

  # 9-entry vocabulary: 36 bytes of float32 logits per token.
  with pk.dense_up_to(36 * 5):
    assert name(5) == "dense"
    assert name(6) == "chunked"
  with pk.dense_up_to(0):
    assert name(5) == "chunked"
  assert name(5) == "dense"  # the default: 256 MiB
  assert _api._schedule("chunked", HIDDEN, UNEMBED, None, None).name == (
    "chunked"
  )
  with pytest.raises(ValueError, match="nbytes must be an int"):
    with pk.dense_up_to(-1):
      pass
