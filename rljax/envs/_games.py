"""Text games for agents: `GridWorld` and `Sokoban` (one box), offline.

A board is drawn as its rows joined by "/", without a border: every cell
outside the drawing is a wall. The 4x4 grid world "A..#/.#../..#./...G"
has the agent top left and the goal bottom right. Symbols:

  #  wall            A  the agent
  .  floor           G  the goal (grid world)
  B  the box         T  the target (Sokoban)
  *  box on target   +  agent on target (Sokoban)

Each policy turn is one move: "U", "D", "L" or "R" ("up", "down", "left",
"right" in any case; `parse_move`); with ``stop_at_move`` a turn ends at
its first move letter. A move into a wall or off the board leaves the
board as it is; a turn that is no move is invalid: a small penalty, the
board unchanged. The observation after a turn is the redrawn board and
the cue ":" (the first prompt's format, so what a policy learns on the
first board it can use on every one), and the state key is the drawing,
so equal boards are equal states (GiGPO's anchor states).

Rewards: 1 on the turn that reaches the goal (grid world) or puts the box
on the target (Sokoban), which ends the episode; minus ``step_penalty``
(in [0, 1)) on every valid move and ``invalid_penalty`` on an invalid
turn, so a turn's reward is positive exactly when it solves the board. A
Sokoban box pushed into a corner that is not the target can never leave
it: the episode ends there (``end_on_deadlock``).

`solve_grid_world` and `solve_sokoban` give a shortest solution (fewest
moves) by breadth-first search; `rljax.tasks.grid_world` and
`rljax.tasks.sokoban` check every layout they generate with them.
"""

from collections.abc import Callable, Mapping
import re
from typing import Any, NamedTuple, Optional

from rljax.envs._base import Action
from rljax.envs._base import Environment
from rljax.envs._base import Start
from rljax.envs._base import Step

CUE = ":"  # ends every prompt and observation: "your move"
MOVES = {"U": (-1, 0), "D": (1, 0), "L": (0, -1), "R": (0, 1)}
GRID_SYMBOLS = "#.AG"
SOKOBAN_SYMBOLS = "#.ABT*+"
_NAMES = {
  "u": "U",
  "up": "U",
  "d": "D",
  "down": "D",
  "l": "L",
  "left": "L",
  "r": "R",
  "right": "R",
}
_WORD = re.compile(r"\b(up|down|left|right)\b")


class Board(NamedTuple):
  """A parsed layout; cells are (row, column) pairs.

  Attributes:
    height: rows.
    width: columns.
    walls: the wall cells.
    agent: the agent's cell.
    goal: the goal (grid world) or the target (Sokoban).
    box: the box's cell (Sokoban); None in the grid world.
  """

  height: int
  width: int
  walls: frozenset
  agent: tuple
  goal: tuple
  box: Optional[tuple] = None


def parse_move(text: str) -> Optional[str]:
  """The move a turn's text names ("U", "D", "L", "R"), or None.

  The whole turn (stripped, any case, a final "." or "!" dropped) may be a
  move's letter or word ("R", "right"); otherwise the text must name
  exactly one of the words "up", "down", "left", "right" ("I go left."),
  repeats allowed. Anything else (two different moves, "UR", nothing) is
  no move.
  """
  t = text.strip().lower().rstrip(".!").strip()
  if t in _NAMES:
    return _NAMES[t]
  found = set(_WORD.findall(t))
  return _NAMES[found.pop()] if len(found) == 1 else None


def parse_board(layout: str, *, sokoban: bool = False) -> Board:
  """A `Board` from a layout's drawing (see the module docstring).

  Raises:
    ValueError: the rows are empty or uneven, a symbol is unknown, or
      there is not exactly one agent and goal (and box, for Sokoban).
  """
  game = "Sokoban" if sokoban else "GridWorld"
  symbols = SOKOBAN_SYMBOLS if sokoban else GRID_SYMBOLS
  rows = layout.split("/") if isinstance(layout, str) else [""]
  if len({len(r) for r in rows}) != 1 or not rows[0]:
    raise ValueError(
      f"a {game} layout is rows of equal, non-zero length joined by '/'"
      f" (e.g. 'A..#/.#../..#./...G'); got {layout!r}."
    )
  unknown = sorted(set("".join(rows)) - set(symbols))
  if unknown:
    raise ValueError(
      f"a {game} layout uses the symbols {symbols!r} only; got {unknown}"
      f" in {layout!r}."
    )
  where: dict[str, list] = {ch: [] for ch in symbols}
  for r, row in enumerate(rows):
    for c, ch in enumerate(row):
      where[ch].append((r, c))
  agents = where["A"] + where.get("+", [])
  goals = where["T"] + where["*"] + where["+"] if sokoban else where["G"]
  boxes = where.get("B", []) + where.get("*", [])
  if len(agents) != 1 or len(goals) != 1 or len(boxes) != int(sokoban):
    things = (
      "an agent, a target and a box" if sokoban else "an agent and a goal"
    )
    raise ValueError(
      f"a {game} layout has exactly one each of {things}; got {layout!r}."
    )
  return Board(
    height=len(rows),
    width=len(rows[0]),
    walls=frozenset(where["#"]),
    agent=agents[0],
    goal=goals[0],
    box=boxes[0] if sokoban else None,
  )


def draw_board(board: Board) -> str:
  """The layout text of a `Board` (the inverse of `parse_board`; a grid
  world's agent on the goal, the end of an episode, is drawn "A")."""
  return "/".join(
    "".join(_symbol(board, (r, c)) for c in range(board.width))
    for r in range(board.height)
  )


def _symbol(board: Board, cell: tuple) -> str:
  if cell in board.walls:
    return "#"
  on_goal = cell == board.goal
  if cell == board.agent:
    return "+" if on_goal and board.box is not None else "A"
  if cell == board.box:
    return "*" if on_goal else "B"
  if on_goal:
    return "T" if board.box is not None else "G"
  return "."


def _free(board: Board, cell: tuple) -> bool:
  r, c = cell
  inside = 0 <= r < board.height and 0 <= c < board.width
  return inside and cell not in board.walls


def _plus(cell: tuple, move: str) -> tuple:
  dr, dc = MOVES[move]
  return cell[0] + dr, cell[1] + dc


def move_board(board: Board, move: str) -> Board:
  """The board after a move: the agent steps into a free cell, pushing
  the box (Sokoban) when the cell beyond it is free; otherwise nothing
  moves."""
  ahead = _plus(board.agent, move)
  if not _free(board, ahead):
    return board
  if ahead != board.box:
    return board._replace(agent=ahead)
  beyond = _plus(ahead, move)
  if not _free(board, beyond):
    return board
  return board._replace(agent=ahead, box=beyond)


def dead_corner(board: Board, cell: tuple) -> bool:
  """A box on `cell` can never move again: a wall (or the edge) above or
  below it and one left or right of it; the target is never dead."""
  if cell == board.goal:
    return False
  blocked = [not _free(board, _plus(cell, m)) for m in "UDLR"]
  return (blocked[0] or blocked[1]) and (blocked[2] or blocked[3])


def _bfs(start: Board, done: Callable[[Board], bool]) -> Optional[str]:
  """The first shortest move string from `start` to a board where `done`
  (moves tried in the order U, D, L, R); None if there is none. States are
  (agent, box); boxes in dead corners are not expanded."""
  key = lambda b: (b.agent, b.box)  # noqa: E731
  paths = {key(start): ""}
  frontier = [start]
  while frontier:
    following = []
    for board in frontier:
      if done(board):
        return paths[key(board)]
      for move in MOVES:
        nxt = move_board(board, move)
        if key(nxt) in paths:
          continue
        paths[key(nxt)] = paths[key(board)] + move
        if nxt.box is None or not dead_corner(nxt, nxt.box):
          following.append(nxt)
    frontier = following
  return None


def solve_grid_world(layout: str) -> Optional[str]:
  """A shortest move string ("RRDD") from the agent to the goal, by
  breadth-first search; None if the goal cannot be reached."""
  return _bfs(parse_board(layout), lambda b: b.agent == b.goal)


def solve_sokoban(layout: str) -> Optional[str]:
  """A shortest move string (fewest moves, pushes included) that puts the
  box on the target, by breadth-first search over (agent, box); None if
  there is none."""
  return _bfs(parse_board(layout, sokoban=True), lambda b: b.box == b.goal)


class _BoardGame(Environment):
  """The turn loop both games share (`GridWorld`, `Sokoban`)."""

  sokoban = False
  deadlock_penalty = 0.0

  def __init__(
    self,
    *,
    max_turns: int,
    invalid_penalty: float,
    step_penalty: float,
    stop_at_move: bool,
  ):
    if not isinstance(max_turns, int) or max_turns < 1:
      raise ValueError(f"max_turns must be an int >= 1; got {max_turns!r}.")
    if not invalid_penalty >= 0:
      raise ValueError(
        f"invalid_penalty must be >= 0 (it is subtracted); got"
        f" {invalid_penalty!r}."
      )
    if not 0 <= step_penalty < 1:
      raise ValueError(
        "step_penalty must be in [0, 1) (so that solving a board still"
        f" earns a positive reward); got {step_penalty!r}."
      )
    self.max_turns = max_turns
    self.invalid_penalty = float(invalid_penalty)
    self.step_penalty = float(step_penalty)
    self.stop_strings = tuple(MOVES) if stop_at_move else ()
    self.board: Optional[Board] = None

  def reset(self, example: Mapping[str, Any]) -> Start:
    """Start on ``example["layout"]``."""
    name = type(self).__name__
    if "layout" not in example:
      raise ValueError(
        f"{name}.reset needs example['layout'] (a board drawn as rows"
        f" joined by '/', as tasks.get({name.lower()!r}) makes); got the"
        f" keys {sorted(example)}."
      )
    self.board = parse_board(example["layout"], sokoban=self.sokoban)
    if self._solved(self.board):
      raise ValueError(f"{name} layout {example['layout']!r} is solved.")
    text = draw_board(self.board)
    return Start(text + CUE, state=text)

  def step(self, action: Action) -> Step:
    """Apply the turn's move; the redrawn board is the observation."""
    if self.board is None:
      raise ValueError(f"{type(self).__name__}.step before reset.")
    move = parse_move(action.text)
    if move is None:
      reward, done = -self.invalid_penalty, False
    else:
      self.board = move_board(self.board, move)
      solved = self._solved(self.board)
      stuck = not solved and self._stuck(self.board)
      reward = float(solved) - self.step_penalty
      reward -= self.deadlock_penalty if stuck else 0.0
      done = solved or stuck
    text = draw_board(self.board)
    return Step(observation=text + CUE, reward=reward, done=done, state=text)

  def _solved(self, board: Board) -> bool:
    return board.agent == board.goal

  def _stuck(self, board: Board) -> bool:
    del board
    return False


class GridWorld(_BoardGame):
  """Walk the agent "A" to the goal "G" on a walled text grid.

  One move per turn (`parse_move`); reward 1 on reaching the goal (the
  episode ends), minus `step_penalty` per valid move, minus
  `invalid_penalty` for a turn that names no move. The observation and
  the state are the redrawn grid (see `rljax.envs._games`).

  Args:
    max_turns: the most moves of an episode.
    invalid_penalty: subtracted for a turn that is no move.
    step_penalty: subtracted for every valid move, in [0, 1).
    stop_at_move: a turn ends at its first move letter (the stop strings
      "U", "D", "L", "R"), so a policy needs no stop token and an episode's
      text is the moves and the boards (a warm start's demonstration);
      False: turns end at the stop token.

  Example:
    >>> env = GridWorld(max_turns=4)
    >>> env.reset({"layout": "A.#/.../..G"}).prompt
    'A.#/.../..G:'
    >>> env.step(Action("R", (), 0)).observation
    '.A#/.../..G:'
  """

  def __init__(
    self,
    *,
    max_turns: int = 8,
    invalid_penalty: float = 0.1,
    step_penalty: float = 0.0,
    stop_at_move: bool = False,
  ):
    super().__init__(
      max_turns=max_turns,
      invalid_penalty=invalid_penalty,
      step_penalty=step_penalty,
      stop_at_move=stop_at_move,
    )


class Sokoban(_BoardGame):
  """Push the one box "B" onto the target "T" on a walled text grid.

  The agent "A" moves one cell per turn (`parse_move`) and pushes the box
  when it walks into it and the cell beyond is free. Reward 1 when the box
  reaches the target (the episode ends), minus `step_penalty` per valid
  move, minus `invalid_penalty` for a turn that is no move. A box pushed
  into a corner that is not the target (a deadlock: it cannot move again)
  ends the episode when `end_on_deadlock`, with `deadlock_penalty`
  subtracted.

  Args:
    max_turns: the most moves of an episode.
    invalid_penalty: subtracted for a turn that is no move.
    step_penalty: subtracted for every valid move, in [0, 1).
    end_on_deadlock: end the episode when the box is stuck in a corner.
    deadlock_penalty: subtracted on the move that makes the deadlock.
    stop_at_move: as `GridWorld`'s.

  Example:
    >>> env = Sokoban(max_turns=4)
    >>> env.reset({"layout": "AB.T/...."}).prompt
    'AB.T/....:'
    >>> env.step(Action("R", (), 0)).observation
    '.ABT/....:'
  """

  sokoban = True

  def __init__(
    self,
    *,
    max_turns: int = 10,
    invalid_penalty: float = 0.1,
    step_penalty: float = 0.0,
    end_on_deadlock: bool = True,
    deadlock_penalty: float = 0.0,
    stop_at_move: bool = False,
  ):
    super().__init__(
      max_turns=max_turns,
      invalid_penalty=invalid_penalty,
      step_penalty=step_penalty,
      stop_at_move=stop_at_move,
    )
    if not deadlock_penalty >= 0:
      raise ValueError(
        f"deadlock_penalty must be >= 0; got {deadlock_penalty!r}."
      )
    self.end_on_deadlock = bool(end_on_deadlock)
    self.deadlock_penalty = float(deadlock_penalty)

  def _solved(self, board: Board) -> bool:
    return board.box == board.goal

  def _stuck(self, board: Board) -> bool:
    return self.end_on_deadlock and dead_corner(board, board.box)
