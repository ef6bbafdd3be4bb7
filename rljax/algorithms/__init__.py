"""Algorithm presets: one-line compositions of advantages, objectives and an
aggregation. `get(name, **kwargs)` looks one up by name; `docs/papers.md`
lists each seed paper's preset or composition."""

from rljax.algorithms._agents import aepo_agentic
from rljax.algorithms._agents import episode_grpo
from rljax.algorithms._agents import episode_rloo
from rljax.algorithms._agents import gigpo
from rljax.algorithms._agents import hgpo
from rljax.algorithms._agents import loop
from rljax.algorithms._agents import poad
from rljax.algorithms._agents import portool
from rljax.algorithms._agents import salt
from rljax.algorithms._agents import seeupo
from rljax.algorithms._agents import turn_grpo
from rljax.algorithms._anytime import brpo
from rljax.algorithms._bounds import bapo
from rljax.algorithms._bounds import dcpo
from rljax.algorithms._budgets import hbpo
from rljax.algorithms._budgets import tlts
from rljax.algorithms._distill import PRESETS as _DISTILL
from rljax.algorithms._distill import opd
from rljax.algorithms._distill import opd_grpo
from rljax.algorithms._markovian import delethink
from rljax.algorithms._offpolicy import disco
from rljax.algorithms._offpolicy import kimi_opmd
from rljax.algorithms._offpolicy import mdpo
from rljax.algorithms._offpolicy import rec
from rljax.algorithms._offpolicy import reg_grpo
from rljax.algorithms._partial import c3po_pp
from rljax.algorithms._partial import tppo
from rljax.algorithms._presets import PRESETS
from rljax.algorithms._presets import bnpo
from rljax.algorithms._presets import cispo
from rljax.algorithms._presets import dapo
from rljax.algorithms._presets import dr_grpo
from rljax.algorithms._presets import get
from rljax.algorithms._presets import gmpo
from rljax.algorithms._presets import gpg
from rljax.algorithms._presets import grpo
from rljax.algorithms._presets import gspo
from rljax.algorithms._presets import ppo
from rljax.algorithms._presets import reinforce_pp
from rljax.algorithms._presets import remax
from rljax.algorithms._presets import rloo
from rljax.algorithms._presets import sapo
from rljax.algorithms._replay import remix
from rljax.algorithms._segments import spo_segment
from rljax.algorithms._segments import spo_tree
from rljax.algorithms._single_stream import spo
from rljax.algorithms._stateful import empo
from rljax.algorithms._stateful import hapo
from rljax.algorithms._stateful import riskpo
from rljax.algorithms._streams import icpo
from rljax.algorithms._teacher import aepo_arbitrary
from rljax.algorithms._teacher import dcpo_dist
from rljax.algorithms._teacher import kepo
from rljax.algorithms._teacher import rto
from rljax.algorithms._teacher import vcpo
from rljax.algorithms._tokens import ares
from rljax.algorithms._tokens import d3s
from rljax.algorithms._tokens import gtpo
from rljax.algorithms._tokens import progrpo
from rljax.algorithms._tokens import rapo
from rljax.algorithms._tokens import red_drop
from rljax.algorithms._tokens import thinkless
from rljax.algorithms._trees import treepo
from rljax.algorithms._variants import adora
from rljax.algorithms._variants import aspo
from rljax.algorithms._variants import copo
from rljax.algorithms._variants import grpo_lambda
from rljax.algorithms._variants import hdpo
from rljax.algorithms._variants import l_grpo
from rljax.algorithms._variants import pf_ppo
from rljax.algorithms._variants import polychromic
from rljax.algorithms._variants import seed_grpo

# On-policy distillation joins the registry that `get` reads.
PRESETS.update(_DISTILL)

__all__ = [
  "PRESETS",
  "adora",
  "aepo_arbitrary",
  "ares",
  "aspo",
  "bapo",
  "bnpo",
  "brpo",
  "c3po_pp",
  "cispo",
  "copo",
  "d3s",
  "dapo",
  "dcpo",
  "dcpo_dist",
  "delethink",
  "disco",
  "dr_grpo",
  "empo",
  "episode_grpo",
  "episode_rloo",
  "get",
  "gigpo",
  "aepo_agentic",
  "portool",
  "gmpo",
  "gpg",
  "grpo",
  "grpo_lambda",
  "gspo",
  "gtpo",
  "hapo",
  "hbpo",
  "hdpo",
  "hgpo",
  "icpo",
  "kepo",
  "kimi_opmd",
  "l_grpo",
  "loop",
  "mdpo",
  "opd",
  "opd_grpo",
  "pf_ppo",
  "poad",
  "polychromic",
  "ppo",
  "progrpo",
  "rapo",
  "rec",
  "red_drop",
  "reg_grpo",
  "reinforce_pp",
  "remax",
  "remix",
  "riskpo",
  "rloo",
  "rto",
  "salt",
  "sapo",
  "seed_grpo",
  "seeupo",
  "spo",
  "spo_segment",
  "spo_tree",
  "thinkless",
  "tlts",
  "tppo",
  "treepo",
  "turn_grpo",
  "vcpo",
]
