"""Text games for agents: `grid_world` and `sokoban` tasks (offline).

Each example is a layout of `rljax.envs.GridWorld` or `rljax.envs.Sokoban`
("A..#/.#../..#./...G"), drawn at random and kept only when breadth-first
search solves it in ``min_moves`` to ``max_moves`` moves, so every episode
can be won within its turns. Layouts are split by a keyed hash of their
drawing (one in `_TEST_SHARE` goes to the test split), so the splits never
share a layout. Train example i is a pure function of (seed, i), drawn
when read; the test split is the first `test_size` distinct test layouts
of a keyed stream, made once.
"""

from collections.abc import Callable, Mapping
import dataclasses
import functools
import random
from typing import Any, Optional

import numpy as np

from rljax import envs
from rljax import rewards
from rljax.envs import _games
from rljax.rewards import Samples
from rljax.rewards._episodes import episode_side
from rljax.tasks._arithmetic import _key
from rljax.tasks._base import Task

GRID_WORLD_ALPHABET = "".join(sorted(set(_games.GRID_SYMBOLS + "/:UDLR")))
SOKOBAN_ALPHABET = "".join(sorted(set(_games.SOKOBAN_SYMBOLS + "/:UDLR")))
_TEST_SHARE = 8  # one layout in 8 belongs to the test split
_ATTEMPTS = 10_000  # failed candidates in a row before giving up


def grid_world(
  *,
  size: int = 4,
  wall_fraction: float = 0.25,
  min_moves: int = 2,
  max_moves: int = 6,
  max_turns: int = 8,
  train_size: int = 10_000,
  test_size: int = 200,
  seed: int = 0,
  invalid_penalty: float = 0.1,
  step_penalty: float = 0.0,
  stop_at_move: bool = True,
) -> Task:
  """Walk to the goal on a `size` x `size` grid (`rljax.envs.GridWorld`).

  A layout has each cell a wall with probability `wall_fraction`, and the
  agent and the goal on two random free cells; it is kept when its
  shortest path has `min_moves` to `max_moves` moves. The prompt is the
  drawing and ":" ("A..#/.#../..#./...G:"), each observation the redrawn
  grid and ":". Rewards: "return" (the episode's return, weight 1),
  "solved" (the goal reached) and "optimal" (reached in the fewest moves),
  both logged with weight 0. With `stop_at_move` (a turn ends at its move
  letter) each example carries a "demonstration": the text of an episode
  that plays a shortest solution ("D..#./..../...A/...G:D"), which the
  supervised warm start learns whole.

  Args:
    size: the grid's side, 3 to 8 (the drawing has size * (size + 1)
      characters with the cue).
    wall_fraction: the chance of each cell being a wall, in [0, 0.6].
    min_moves: the fewest moves a layout's solution may take, >= 1.
    max_moves: the most, <= `max_turns`.
    max_turns: the episode's most moves (`GridWorld.max_turns`).
    train_size: length of the train dataset.
    test_size: number of distinct held-out layouts.
    seed: selects the layouts and the split; same seed, same examples.
    invalid_penalty: `GridWorld`'s penalty for a turn that is no move.
    step_penalty: `GridWorld`'s penalty per move, in [0, 1).
    stop_at_move: `GridWorld`'s: turns end at their move letter.

  Returns:
    A `Task` named "grid_world" with ``environment`` a `GridWorld`
    factory; examples are {"question", "answer", "layout", "solution",
    "moves", "split", "index"} and with `stop_at_move` "demonstration":
    the layout (also the question), the first move of a shortest solution
    as the answer, a shortest solution and its length.
  """
  env = functools.partial(
    envs.GridWorld,
    max_turns=max_turns,
    invalid_penalty=invalid_penalty,
    step_penalty=step_penalty,
    stop_at_move=stop_at_move,
  )
  return _game_task(
    "grid_world",
    env,
    _Layouts(False, size, wall_fraction, min_moves, max_moves, stop_at_move),
    train_size=train_size,
    test_size=test_size,
    seed=seed,
    alphabet=GRID_WORLD_ALPHABET,
  )


def sokoban(
  *,
  size: int = 4,
  wall_fraction: float = 0.1,
  min_moves: int = 3,
  max_moves: int = 8,
  max_turns: int = 10,
  train_size: int = 10_000,
  test_size: int = 200,
  seed: int = 0,
  invalid_penalty: float = 0.1,
  step_penalty: float = 0.0,
  end_on_deadlock: bool = True,
  deadlock_penalty: float = 0.0,
  stop_at_move: bool = True,
) -> Task:
  """Push one box onto its target on a `size` x `size` grid
  (`rljax.envs.Sokoban`; the edge is a wall, so 4 is a 6x6 board with its
  border).

  A layout has each cell a wall with probability `wall_fraction`, the box
  on a random free cell that is not a dead corner, and the target and the
  agent on two other free cells; it is kept when breadth-first search over
  (agent, box) solves it in `min_moves` to `max_moves` moves (pushes
  included). Prompts, observations and rewards as `grid_world` ("solved":
  the box on the target).

  Args:
    size: the grid's side without the border, 3 to 8.
    wall_fraction: the chance of each cell being a wall, in [0, 0.6].
    min_moves: the fewest moves a layout's solution may take, >= 1.
    max_moves: the most, <= `max_turns`.
    max_turns: the episode's most moves (`Sokoban.max_turns`).
    train_size: length of the train dataset.
    test_size: number of distinct held-out layouts.
    seed: selects the layouts and the split; same seed, same examples.
    invalid_penalty: `Sokoban`'s penalty for a turn that is no move.
    step_penalty: `Sokoban`'s penalty per move, in [0, 1).
    end_on_deadlock: a box pushed into a dead corner ends the episode.
    deadlock_penalty: subtracted on that move.
    stop_at_move: `Sokoban`'s: turns end at their move letter.

  Returns:
    A `Task` named "sokoban" with ``environment`` a `Sokoban` factory;
    examples as `grid_world`'s.
  """
  env = functools.partial(
    envs.Sokoban,
    max_turns=max_turns,
    invalid_penalty=invalid_penalty,
    step_penalty=step_penalty,
    end_on_deadlock=end_on_deadlock,
    deadlock_penalty=deadlock_penalty,
    stop_at_move=stop_at_move,
  )
  return _game_task(
    "sokoban",
    env,
    _Layouts(True, size, wall_fraction, min_moves, max_moves, stop_at_move),
    train_size=train_size,
    test_size=test_size,
    seed=seed,
    alphabet=SOKOBAN_ALPHABET,
  )


def _game_task(
  name: str,
  env: Callable[[], envs.Environment],
  layouts: "_Layouts",
  *,
  train_size: int,
  test_size: int,
  seed: int,
  alphabet: str,
) -> Task:
  """Validate the arguments and build the task's splits."""
  max_turns = env().max_turns  # the environment validates its own
  _check(layouts, max_turns, train_size, test_size, seed)
  import grain

  key = _key(
    name,
    seed,
    layouts.size,
    layouts.wall_fraction,
    layouts.min_moves,
    layouts.max_moves,
  )
  layouts = dataclasses.replace(layouts, key=key)
  train = grain.MapDataset.range(train_size).map(_Train(layouts))
  test = grain.MapDataset.source(_test_split(layouts, test_size))
  return Task(
    name=name,
    train=train,
    test=test,
    rewards=(
      ("return", rewards.episode_return(), 1.0),
      ("solved", _solved(), 0.0),
      ("optimal", _optimal(), 0.0),
    ),
    format_prompt=_prompt,
    alphabet=alphabet,
    environment=env,
  )


def _check(layouts, max_turns, train_size, test_size, seed) -> None:
  if not isinstance(layouts.size, int) or not 3 <= layouts.size <= 8:
    raise ValueError(f"size must be an int in [3, 8]; got {layouts.size!r}.")
  if not 0 <= layouts.wall_fraction <= 0.6:
    raise ValueError(
      f"wall_fraction must be in [0, 0.6]; got {layouts.wall_fraction!r}."
    )
  low, high = layouts.min_moves, layouts.max_moves
  if not (isinstance(low, int) and isinstance(high, int) and 1 <= low):
    raise ValueError(f"min_moves must be an int >= 1; got {low!r}.")
  if not low <= high <= max_turns:
    raise ValueError(
      f"max_moves must be in [min_moves, max_turns] = [{low}, {max_turns}]"
      f" (every layout is solvable within the episode); got {high!r}."
    )
  for arg, value in (("train_size", train_size), ("test_size", test_size)):
    if not isinstance(value, int) or value < 1:
      raise ValueError(f"{arg} must be a positive int; got {value!r}.")
  if not isinstance(seed, int) or seed < 0:
    raise ValueError(f"seed must be an int >= 0; got {seed!r}.")


def _prompt(example: Mapping[str, Any]) -> str:
  """The first prompt of an episode: the layout and the cue,
  "A..#/.#../..#./...G:" (`rljax.envs.GridWorld.reset`'s)."""
  return example["layout"] + _games.CUE


def _demonstration(layout: str, moves: str, sokoban: bool) -> str:
  """The text after the prompt of an episode that plays `moves` with
  ``stop_at_move``: each move, and after every move but the last (which
  ends the episode) the redrawn board and the cue."""
  board = _games.parse_board(layout, sokoban=sokoban)
  parts = []
  for i, move in enumerate(moves):
    board = _games.move_board(board, move)
    parts.append(move)
    if i < len(moves) - 1:
      parts.append(_games.draw_board(board) + _games.CUE)
  return "".join(parts)


@dataclasses.dataclass(frozen=True)
class _Layouts:
  """Random layouts of one game (keyed; see `candidate` and `example`)."""

  sokoban: bool
  size: int
  wall_fraction: float
  min_moves: int
  max_moves: int
  demonstrate: bool
  key: int = 0

  def candidate(self, rng: random.Random) -> Optional[str]:
    """A random drawing (not yet checked), or None when too few cells are
    free."""
    cells = [(r, c) for r in range(self.size) for c in range(self.size)]
    walls = frozenset(x for x in cells if rng.random() < self.wall_fraction)
    free = [x for x in cells if x not in walls]
    if len(free) < 2 + self.sokoban:
      return None
    if not self.sokoban:
      agent, goal = rng.sample(free, 2)
      board = _games.Board(self.size, self.size, walls, agent, goal)
      return _games.draw_board(board)
    board = _games.Board(self.size, self.size, walls, None, None)
    movable = [x for x in free if not _games.dead_corner(board, x)]
    if not movable:
      return None
    box = rng.choice(movable)
    agent, goal = rng.sample([x for x in free if x != box], 2)
    board = board._replace(agent=agent, goal=goal, box=box)
    return _games.draw_board(board)

  def is_test(self, layout: str) -> bool:
    """The layout belongs to the test split (a keyed hash of it)."""
    return _key(self.key, layout) % _TEST_SHARE == 0

  def example(self, layout: str) -> Optional[dict[str, Any]]:
    """The example of a layout, or None when it is not solvable in
    `min_moves` to `max_moves` moves."""
    solve = _games.solve_sokoban if self.sokoban else _games.solve_grid_world
    solution = solve(layout)
    if solution is None:
      return None
    if not self.min_moves <= len(solution) <= self.max_moves:
      return None
    example = {
      "question": layout,
      "answer": solution[0],
      "layout": layout,
      "solution": solution,
      "moves": len(solution),
    }
    if self.demonstrate:
      example["demonstration"] = _demonstration(layout, solution, self.sokoban)
    return example

  def give_up(self) -> ValueError:
    return ValueError(
      f"no layout of size {self.size} with wall_fraction"
      f" {self.wall_fraction} is solvable in {self.min_moves} to"
      f" {self.max_moves} moves in {_ATTEMPTS} tries; lower min_moves,"
      " raise max_moves or change wall_fraction."
    )


@dataclasses.dataclass(frozen=True)
class _Train:
  """index -> train example (a picklable grain map function)."""

  layouts: _Layouts

  def __call__(self, index: int) -> dict[str, Any]:
    index = int(index)
    rng = random.Random(_key(self.layouts.key, "train", index))
    for _ in range(_ATTEMPTS):
      layout = self.layouts.candidate(rng)
      if layout is None or self.layouts.is_test(layout):
        continue
      example = self.layouts.example(layout)
      if example is not None:
        return example | {"split": "train", "index": index}
    raise self.layouts.give_up()


def _test_split(layouts: _Layouts, size: int) -> list[dict[str, Any]]:
  """The first `size` distinct test layouts of the keyed stream."""
  rng = random.Random(_key(layouts.key, "test"))
  seen: set[str] = set()
  out: list[dict[str, Any]] = []
  failed = 0
  while len(out) < size:
    if failed == _ATTEMPTS:
      raise layouts.give_up()
    failed += 1
    layout = layouts.candidate(rng)
    if layout is None or layout in seen or not layouts.is_test(layout):
      continue
    seen.add(layout)
    example = layouts.example(layout)
    if example is not None:
      out.append(example | {"split": "test", "index": len(out)})
      failed = 0
  return out


def _solved_N(samples: Samples, by: str) -> np.ndarray:
  """Whether each episode solved its board: some turn's reward is
  positive (the solving turn earns 1 - step_penalty > 0, every other turn
  at most 0)."""
  turn_rewards = episode_side(samples, "turn_rewards_PG", by)
  return (turn_rewards > 0).any(-1)


def _solved():
  """1 where the episode solved its board (the goal reached, the box on
  the target), else 0; read from the turn rewards."""

  def reward(samples: Samples) -> np.ndarray:
    return _solved_N(samples, "solved").astype(np.float32)

  return reward


def _optimal():
  """1 where the episode solved its board in its example's fewest moves
  (``metadata["moves"]``; an invalid or wasted move spoils it), else 0."""

  def reward(samples: Samples) -> np.ndarray:
    turns = episode_side(samples, "turns_PG", "optimal")
    moves = np.asarray([m["moves"] for m in samples.metadata], np.float32)
    return (_solved_N(samples, "optimal") & (turns == moves)).astype(np.float32)

  return reward
