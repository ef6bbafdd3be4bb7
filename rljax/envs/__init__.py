"""Environments: multi-turn, tool-using episodes for agentic RL.

An `Environment` is one episode of an interactive task, token-in/token-out:
`reset(example)` gives the first context (`Start`: text, chat messages or
token ids, and the tools' schemas), `step(action)` answers each policy turn
(`Action`: its text and tokens) with a `Step`: the observation to append
(a tool's output, the game's next state), a reward, done, the state's key
and the turn's tool-call counts. Single-turn tasks are the one-step case.

`run_episodes` runs many episodes at once on the rollout engine
(`rljax.sampling.Engine`): an episode's sequence pauses after each turn,
its environment step runs in a thread while other episodes decode, and the
observation's tokens are appended to the cached sequence (`Engine.extend`),
so no prompt is re-encoded and each episode samples exactly what decoding
its turns one by one would. `EpisodeRollouts` is the group strategy the
trainer uses for a task with an environment; `BranchingEpisodes` grows
each group as a tree of episodes with a branching rule (`ARPOBranching`,
`AEPOBranching`, `PORToolBranching`; strategies "arpo", "aepo",
"portool").

`ToolEnvironment` answers a question with tools (`rljax.tools`): each
turn's calls run and their results are the observation, the first turn
without a call is the answer. Built-in text games (offline, for turn-level
credit): `GridWorld` and `Sokoban` (`rljax.tasks.grid_world`,
`rljax.tasks.sokoban`).

The agent data layout (what the batch carries, `Batch.extra`; N = max
turns):
  loss_mask_PGT      1 on the policy's tokens, 0 on observations: the
                     trainer multiplies ``Batch.mask_PGT`` by it, so the
                     loss, the KL and entropy terms see actions only
  turn_ids_PGT       the turn of each completion token (-1: padding)
  turns_PG           actions taken
  turn_rewards_PG    [P, G, N] each action's reward
  state_ids_PG       [P, G, N] the state each action acted in (equal ids:
                     equal states; -1: not reported)
  tool_calls_PG      [P, G, N] tool calls per action; tool_errors_PG: the
                     failed ones
  episode_return_PG  the sum of the turn rewards
  node_ids_PG        [P, G, N] each action's node in the group's tree
                     (equal ids: an action shared by branched samples)
  fork_ids_PG        [P, G, N] with `BranchingEpisodes`: the fork of each
                     action (`sibling_groups`)
Reward functions see the ``_PG`` arrays in ``Samples.extra``
(`rljax.rewards.episode_return` reads the return).
"""

from rljax import rollouts
from rljax.envs._base import Action
from rljax.envs._base import Content
from rljax.envs._base import Environment
from rljax.envs._base import Start
from rljax.envs._base import Step
from rljax.envs._branching import TREE_STRATEGIES
from rljax.envs._branching import AEPOBranching
from rljax.envs._branching import AEPOEpisodes
from rljax.envs._branching import ARPOBranching
from rljax.envs._branching import BranchingEpisodes
from rljax.envs._branching import PORToolBranching
from rljax.envs._branching import aepo_episodes
from rljax.envs._branching import aepo_initial_rollouts
from rljax.envs._branching import aepo_window_entropies
from rljax.envs._branching import arpo_episodes
from rljax.envs._branching import portool_episodes
from rljax.envs._branching import sibling_groups
from rljax.envs._episodes import BranchPoint
from rljax.envs._episodes import Episodes
from rljax.envs._episodes import run_episodes
from rljax.envs._games import GridWorld
from rljax.envs._games import Sokoban
from rljax.envs._games import parse_move
from rljax.envs._games import solve_grid_world
from rljax.envs._games import solve_sokoban
from rljax.envs._render import Renderer
from rljax.envs._strategy import EpisodeRollouts
from rljax.envs._tools import ToolEnvironment

STRATEGIES = {"episodes": EpisodeRollouts, **TREE_STRATEGIES}
# `rljax.rollouts.get` builds them by name (``sampler.groups``): rollouts
# does not import this package, which builds on it.
rollouts.register(STRATEGIES)

__all__ = [
  "STRATEGIES",
  "AEPOBranching",
  "AEPOEpisodes",
  "ARPOBranching",
  "Action",
  "BranchPoint",
  "BranchingEpisodes",
  "Content",
  "Environment",
  "EpisodeRollouts",
  "Episodes",
  "GridWorld",
  "PORToolBranching",
  "Renderer",
  "Sokoban",
  "Start",
  "Step",
  "ToolEnvironment",
  "aepo_episodes",
  "aepo_initial_rollouts",
  "aepo_window_entropies",
  "arpo_episodes",
  "parse_move",
  "portool_episodes",
  "run_episodes",
  "sibling_groups",
  "solve_grid_world",
  "solve_sokoban",
]
