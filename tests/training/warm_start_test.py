"""The supervised warm start: batches as wide as their longest answer, the
same loss as the padded batch, and the warm-start cache."""

import dataclasses
import pathlib

from flax import nnx
import jax
import numpy as np
import pytest

from rljax.tokenizers import Tokenizer
from rljax.training import _build
from rljax.training import _warm_start
from rljax.training import load_config
from rljax.training import override
from rljax.training._step import Sequences
from rljax.training._step import completion_logprobs

CONFIGS = pathlib.Path(__file__).resolve().parents[2] / "configs"


class _Task:
  def format_prompt(self, example):
    return example["question"]


def _batch(answers, answer_width):
  tokenizer = Tokenizer.from_characters("0123456789+=")
  examples = [{"question": "1+1=", "answer": a} for a in answers]
  return _warm_start.answer_batch(tokenizer, _Task(), examples, 5, answer_width)


def test_a_batch_is_as_wide_as_its_longest_answer_in_buckets_of_8():
  # "12" + EOS: 3 tokens -> 8 wide; 9 digits + EOS: 10 -> 16; capped at 12.
  seqs, mask = _batch(["12", "7"], 40)
  assert mask.shape == (2, 1, 8) and seqs.tokens_PGL.shape == (2, 1, 5 + 8)
  np.testing.assert_array_equal(mask[:, 0].sum(-1), [3, 2])
  _, mask = _batch(["12", "123456789"], 40)
  assert mask.shape == (2, 1, 16)
  np.testing.assert_array_equal(mask[:, 0].sum(-1), [3, 10])
  seqs, mask = _batch(["123456789012345"], 12)  # 16 tokens, cut to 12
  assert mask.shape == (1, 1, 12) and mask.sum() == 12


def _loss(model, seqs, mask):
  logp, _ = completion_logprobs(
    model, seqs, mask.shape[-1], temperature=1.0, schedule="chunked"
  )
  return -(logp * mask).sum() / mask.sum()


def test_the_trimmed_batch_has_the_padded_batchs_loss_and_gradient():
  config = load_config(CONFIGS / "grpo.py")
  model, _ = _build.build_policy(config.model, "0123456789+=", 0)
  seqs, mask = _batch(["12", "345"], 40)  # 8 wide
  pad = 16
  padded = Sequences(
    tokens_PGL=np.pad(seqs.tokens_PGL, ((0, 0), (0, 0), (0, pad))),
    mask_PGL=np.pad(seqs.mask_PGL, ((0, 0), (0, 0), (0, pad))),
  )
  padded_mask = np.pad(mask, ((0, 0), (0, 0), (0, pad)))
  graphdef, params = nnx.split(model)

  def value_and_grad(seqs, mask):
    f = lambda p: _loss(nnx.merge(graphdef, p), seqs, mask)  # noqa: E731
    return jax.jit(jax.value_and_grad(f))(params)

  (v, g), (v_pad, g_pad) = (
    value_and_grad(seqs, mask),
    value_and_grad(padded, padded_mask),
  )
  np.testing.assert_allclose(v, v_pad, rtol=1e-6)
  jax.tree.map(
    lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7),
    g,
    g_pad,
  )


def _warm(tmp_path, *overrides):
  config = override(
    load_config(CONFIGS / "grpo.py"),
    [
      "train.warm_start_steps=3",
      "train.warm_start_batch=8",
      f"train.warm_start_cache={tmp_path / 'cache'}",
      *overrides,
    ],
  )
  task = _build.build_task(config.task, config.sandbox)
  model, tokenizer = _build.build_policy(config.model, task.alphabet, 0)
  losses = _warm_start.warm_start_model(model, task, tokenizer, config)
  return nnx.state(model), losses


def test_the_cache_restores_the_same_warm_start_and_misses_on_a_change(
  tmp_path, monkeypatch
):
  trained, losses = _warm(tmp_path)
  assert len(losses) == 3
  calls = []
  real = _warm_start.warm_start
  monkeypatch.setattr(
    _warm_start,
    "warm_start",
    lambda *a, **k: calls.append(1) or real(*a, **k),
  )
  restored, restored_losses = _warm(tmp_path)
  assert not calls and restored_losses == losses
  jax.tree.map(np.testing.assert_array_equal, restored, trained)
  # Another step count (or lr, data, model) is another entry: it trains.
  _, longer = _warm(tmp_path, "train.warm_start_steps=4")
  assert calls == [1] and len(longer) == 4
  assert len(list((tmp_path / "cache").iterdir())) == 2


def test_a_cache_that_is_not_a_path_names_the_field():
  from rljax.training import Trainer

  config = load_config(CONFIGS / "grpo.py")
  config = dataclasses.replace(
    config, train=dataclasses.replace(config.train, warm_start_cache=3)
  )
  with pytest.raises(ValueError, match="train.warm_start_cache=3"):
    Trainer(config)
