"""The environment interface: `Environment`, `Start`, `Action`, `Step`."""

from collections.abc import Mapping, Sequence
import copy
from typing import Any, NamedTuple, Optional

# A prompt or observation: text, chat messages ({"role", "content"} dicts,
# rendered by the chat template) or token ids (appended as they are).
Content = str | Sequence[Mapping[str, Any]] | Sequence[int]


class Start(NamedTuple):
  """How an episode begins (`Environment.reset`).

  Attributes:
    prompt: the episode's first context: text (a user message in chat runs,
      the prompt itself otherwise), chat messages (a system message with
      instructions, the user's task, ...) or token ids.
    state: a key of the environment's state (hashable text, e.g. a grid's
      drawing): actions taken in equal states are compared by turn-level
      estimators (GiGPO's anchor states); None: not tracked.
    tools: JSON schemas of the tools the chat template lists
      (`rljax.tools.Toolbox.schemas`); empty: none.
  """

  prompt: Content
  state: Optional[str] = None
  tools: Sequence[Mapping[str, Any]] = ()


class Action(NamedTuple):
  """One turn of the policy, as the environment sees it.

  Attributes:
    text: the turn's text (special tokens kept, the final stop token
      dropped).
    tokens: the sampled token ids of the turn (the stop token included).
    turn: its index, 0 for the first action.
    truncated: the turn hit its token budget without a stop token or stop
      string.
  """

  text: str
  tokens: tuple
  turn: int
  truncated: bool = False


class Step(NamedTuple):
  """What the environment returns for an action (`Environment.step`).

  Attributes:
    observation: what the policy sees next (text, chat messages such as
      ``{"role": "tool", "content": ...}``, or token ids); appended to the
      sequence and masked out of the loss. Ignored when `done`.
    reward: the action's reward (the episode's return is their sum).
    done: the episode ended.
    state: the key of the state the next action acts in (see `Start`).
    tool_calls: tool calls the action made.
    tool_errors: of them, the ones that failed (malformed, unknown tool,
      bad arguments, an exception, a time-out).
  """

  observation: Optional[Content] = None
  reward: float = 0.0
  done: bool = False
  state: Optional[str] = None
  tool_calls: int = 0
  tool_errors: int = 0


class Environment:
  """One episode of an interactive task, token-in/token-out.

  The episode runner makes a fresh instance per episode (the task's
  ``environment`` factory), calls `reset` with the task example, then
  `step` with each policy turn until a `Step` says ``done``, the episode
  reaches ``max_turns`` actions, or the context budget runs out. Steps of
  different episodes run concurrently in threads (and concurrently with
  decoding), so an instance must not share mutable state with others.
  A single-turn task is the one-step case (``max_turns = 1``).

  Attributes:
    max_turns: the most actions of an episode.
    stop_strings: strings that end a policy turn besides the stop tokens
      (e.g. ``"</tool_call>"``, so the tool runs as soon as it is called).
  """

  max_turns: int = 1
  stop_strings: tuple = ()

  def reset(self, example: Mapping[str, Any]) -> Start:
    """Start an episode on the task example."""
    raise TypeError(
      f"{type(self).__name__} must define reset(example) -> envs.Start."
    )

  def step(self, action: Action) -> Step:
    """Respond to the policy's turn."""
    raise TypeError(
      f"{type(self).__name__} must define step(action) -> envs.Step."
    )

  def fork(self) -> "Environment":
    """A copy that continues independently from the current state (for
    trees of episodes, `run_episodes(branch=...)`). Default: a deep copy;
    override it to share what need not be copied (a tool sandbox)."""
    return copy.deepcopy(self)

  def close(self) -> None:
    """Release what the episode holds (called once it ends)."""
