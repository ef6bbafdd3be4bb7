"""The Pallas TPU kernels compile for real TPUs (Mosaic), from this CPU host:
forward and backward of the token log-prob and the SAPO loss, float32 and
bfloat16, at shapes that are and are not multiples of the tiles, for v5e,
v5p and v6e (`jax.experimental.topologies`; needs libtpu, the ``tpu``
extra). Each compiled program holds the Mosaic kernel, not the chunked XLA
schedule."""

import jax
import jax.numpy as jnp
import pytest

import pallas_kernels as pk
from rljax.plan import _measure
from rljax.plan import _plan
from rljax.plan._chips import parse_slice

pytest.importorskip(
  "libtpu",
  reason="compiling for a TPU needs libtpu: pip install -e '.[tpu]'",
)


@pytest.fixture(autouse=True)
def _no_persistent_cache():
  """Programs compiled for a topology cannot be loaded back without a TPU
  client; keep them out of the test run's compilation cache (as the plans
  do: the flag, and a reset, since JAX decides once whether to use it)."""
  with _measure._no_persistent_cache():
    yield


# (tokens, width, vocabulary): tile multiples (512 x 2048) and not, and a
# model as wide as Qwen3-8B, whose default blocks need 100 MiB of VMEM (a
# v5p has 64: the blocks are fitted, `_pallas_tpu._fit`).
SHAPES = {
  "tiles": (1024, 256, 4096),
  "ragged": (700, 192, 3000),
  "wide": (512, 4096, 8192),
}


def _programs(n, d, v, dtype):
  """(hidden, unembed) -> the summed log-prob's and SAPO loss's value and
  gradients, with their abstract inputs."""
  targets = jnp.arange(n, dtype=jnp.int32) % v
  ones = jnp.ones((n,), jnp.float32)

  def logprob(hidden, unembed):
    return jnp.sum(pk.token_logprob(hidden, unembed, targets)[0])

  def sapo(hidden, unembed):
    loss, _ = pk.policy_loss(
      hidden, unembed, targets, -ones, ones - 0.5, ones, loss="sapo"
    )
    return jnp.sum(loss)

  args = (
    jax.ShapeDtypeStruct((n, d), dtype),
    jax.ShapeDtypeStruct((d, v), dtype),
  )
  return {"logprob": logprob, "sapo": sapo}, args


def _compile_on(chip, fn, args):
  # (`topology_devices` lets processes side by side load libtpu.)
  device = _plan.topology_devices(
    parse_slice(f"{chip}:{'2x2' if chip != 'v5p' else '2x2x1'}")
  )[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  args = [
    jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sharding) for a in args
  ]
  # "auto" runs these logits dense (they are small); fused at any size.
  with pk.compile_for("tpu", device_kind=device.device_kind):
    with pk.dense_up_to(0):
      lowered = jax.jit(jax.value_and_grad(fn, argnums=(0, 1))).lower(*args)
  return lowered.as_text(), lowered.compile()


def _check(chip, dtype, shape):
  programs, args = _programs(*SHAPES[shape], dtype)
  for name, fn in programs.items():
    text, compiled = _compile_on(chip, fn, args)
    # Forward and both backward kernels are Mosaic custom calls.
    assert text.count("tpu_custom_call") >= 3, (chip, name)
    memory = compiled.memory_analysis()
    assert memory.temp_size_in_bytes < 64 * 2**20, (chip, name, memory)


# All 18 cases in the TPU compile step (`-m tpu`, about 2 min on 2 cores;
# tests/plan/plan_test.py lowers the demo's update with the kernel too). Mosaic refuses a kernel whose
# scoped VMEM exceeds the target chip's, so a compile is also the VMEM
# check.
@pytest.mark.tpu
@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("chip", ["v5e", "v5p", "v6e"])
def test_the_kernels_compile_for_each_chip(chip, dtype, shape):
  _check(chip, jnp.dtype(dtype), shape)


@pytest.mark.tpu
def test_the_grouped_matmul_kernel_compiles_and_costs_its_rows():
  # 128 experts, Qwen3-30B-A3B's widths: forward, d/dx and d/dw are the
  # megablox Mosaic kernels, and the compiled cost is the rows' 3 x 2 m d f
  # FLOPs. XLA's ragged_dot counts its d/dw dense over the experts.
  m, d, f, e = 1024, 2048, 768, 128
  device = _plan.topology_devices(parse_slice("v5e:2x2"))[0]
  sharding = jax.sharding.SingleDeviceSharding(device)
  args = [
    jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
    for shape, dtype in (
      ((m, d), jnp.bfloat16),
      ((e, d, f), jnp.bfloat16),
      ((e,), jnp.int32),
    )
  ]

  def loss(x, w, sizes):
    out = pk.grouped_matmul(x, w, sizes)
    return jnp.sum(out.astype(jnp.float32))

  def grads():  # a new jit each time: its traces are cached per function
    return jax.jit(jax.value_and_grad(loss, argnums=(0, 1)))

  with pk.compile_for("tpu", device_kind=device.device_kind):
    lowered = grads().lower(*args)
  assert lowered.as_text().count("tpu_custom_call") >= 3
  flops = lowered.compile().cost_analysis()["flops"]
  assert flops == pytest.approx(3 * 2 * m * d * f, rel=0.05)
  with pk.compile_for("cpu"):  # XLA's op, for contrast
    dense = grads().lower(*args).compile().cost_analysis()["flops"]
  assert dense > 10 * flops


@pytest.mark.tpu
def test_an_expert_sharded_moe_update_compiles_with_the_kernel():
  # A 2-layer MoE model's loss gradient on a v5e:2x2 mesh (fsdp 2 x tensor
  # 2): the expert layers run per device under shard_map, on the megablox
  # kernels (in the forward, and gmm and tgmm in the backward).
  from flax import nnx

  from rljax import sharding as rsharding
  from rljax.models import ModelConfig
  from rljax.models import Transformer
  from rljax.training import _abstract

  config = ModelConfig(
    vocab_size=256,
    hidden_size=128,
    intermediate_size=256,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=32,
    num_experts=8,
    experts_per_token=2,
    expert_intermediate_size=128,
    scan_unroll=2,
  )
  devices = _plan.topology_devices(parse_slice("v5e:2x2"))
  mesh = rsharding.make_mesh(1, 2, 2, devices=devices)
  model = nnx.eval_shape(lambda: Transformer(config, rngs=nnx.Rngs(0)))
  graphdef = nnx.graphdef(model)
  state = _abstract._placed(model, mesh)  # abstract, sharded as trained
  rows = rsharding.batch_sharding(mesh, 2)
  tokens = jax.ShapeDtypeStruct((8, 64), jnp.int32, sharding=rows)

  def loss(state, tokens):
    logits = nnx.merge(graphdef, state)(tokens, jnp.ones_like(tokens))[0]
    return jnp.mean(jnp.square(logits))

  with (
    jax.set_mesh(mesh),
    pk.compile_for("tpu", device_kind=devices[0].device_kind),
  ):
    lowered = jax.jit(jax.value_and_grad(loss)).lower(state, tokens)
  assert lowered.as_text().count("tpu_custom_call") >= 3
  assert lowered.compile().cost_analysis()["flops"] > 0
