"""Batched and unbatched CartPole over torch RPC: one agent (rank 0), N observers (workers).

Shared by ``notebooks/04_batched_vs_unbatched.ipynb`` (results, table, chart) and by
``bench/rpc/batching.py``, a script, where the classes must live in an importable module (the
notebook defines its own ``Policy``/``Observer``/``Agent`` in cells: they are the tutorial).
Each observer steps a gymnasium ``CartPole-v1`` (new API) and asks the agent for each action:
``Agent.select_action`` answers one state at once, ``Agent.select_action_batch``
(``@rpc.functions.async_execution``) answers all observers with one policy run. Batched and
unbatched runs use the same seeds; the policy lives on ``device``. How:
docs/how-it-works.md, Module notes.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
from torch import optim
from torch.distributions import Categorical

from ..table import write_csv as _write_csv
from ..telemetry.records import log

__all__ = [
    "MODES",
    "RESULTS",
    "Agent",
    "Observer",
    "Policy",
    "plot_results",
    "record",
    "run_config",
    "table",
    "write_csv",
]

#: Every timing recorded with ``record`` in this process: dicts
#: ``{"observers": int, "mode": "batched" | "unbatched", "seconds": float, ...}``.
RESULTS: list[dict] = []

#: The two agents compared, in the order tables and charts show them.
MODES = ("batched", "unbatched")


class Policy(nn.Module):
    """A two-layer policy: 4 state numbers in, probabilities of the 2 actions out.

    ``softmax`` runs over the last dimension, so one state ``(1, 4)`` and a batch ``(N, 4)``
    both work with the same module (the tutorial switched ``dim`` with a flag instead).
    """

    def __init__(self, hidden: int = 128) -> None:
        super().__init__()
        self.affine1 = nn.Linear(4, hidden)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(hidden, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.dropout(self.affine1(x)))
        return F.softmax(self.affine2(x), dim=-1)


class Observer:
    """Runs on a worker: steps its own CartPole and asks the agent for every action."""

    def __init__(self, ob_id: int, batch: bool, seed: int, gamma: float = 1.0) -> None:
        import gymnasium as gym

        self.id = ob_id  # row of this observer in the agent's batch
        self.env = gym.make("CartPole-v1")
        self.seed = seed + self.id
        self.gamma = gamma
        self.first_reset = True
        self.select_action = Agent.select_action_batch if batch else Agent.select_action

    def ready(self) -> int:
        """A cheap call the agent uses to wait until this observer is built."""
        return self.id

    def _reset(self) -> Any:
        seed, self.first_reset = (self.seed if self.first_reset else None), False
        state, _info = self.env.reset(seed=seed)
        return state

    def run_episode(self, agent_rref: rpc.RRef, n_steps: int) -> tuple[torch.Tensor, int]:
        """Run ``n_steps`` steps (restarting the game whenever it ends).

        Returns the discounted returns of every step and the length of the first game.
        """
        state = self._reset()
        rewards = torch.zeros(n_steps)
        first_len, start = n_steps, 0
        owner = agent_rref.owner()
        for step in range(n_steps):
            x = torch.from_numpy(state).float().unsqueeze(0)
            action = rpc.rpc_sync(owner, self.select_action, args=(agent_rref, self.id, x))
            state, reward, terminated, truncated, _ = self.env.step(action)
            rewards[step] = reward
            if terminated or truncated or step + 1 == n_steps:
                running = 0.0
                for i in range(step, start - 1, -1):  # rewards-to-go of this game
                    running = float(rewards[i]) + self.gamma * running
                    rewards[i] = running
                if start == 0:
                    first_len = step + 1
                state, start = self._reset(), step + 1
        return rewards, first_len


class Agent:
    """Owns the policy, drives the observers (one RRef each), learns after every episode."""

    def __init__(self, observers: Sequence[str], batch: bool = True, seed: int = 543,
                 gamma: float = 1.0, lr: float = 1e-2, device: str = "cpu") -> None:
        torch.manual_seed(seed)
        self.batch = batch
        self.device = torch.device(device)
        self.policy = Policy().to(self.device)
        self.optimizer = optim.Adam(self.policy.parameters(), lr=lr)
        self.agent_rref = rpc.RRef(self)
        self.ob_rrefs = [rpc.remote(name, Observer, args=(i, batch, seed, gamma))
                         for i, name in enumerate(observers)]
        n = len(self.ob_rrefs)
        self.lock = threading.Lock()
        self.states = torch.zeros(n, 4, device=self.device)
        self.pending = n
        self.future_actions: torch.futures.Future = torch.futures.Future()
        self.saved_log_probs: Any = [] if batch else {i: [] for i in range(n)}
        self.running_reward = 0.0

    def wait_ready(self) -> None:
        """Block until every observer is built (imports gymnasium, makes its env)."""
        torch.futures.wait_all([r.rpc_async().ready() for r in self.ob_rrefs])

    @staticmethod
    def select_action(agent_rref: rpc.RRef, ob_id: int, state: torch.Tensor) -> int:
        """Unbatched: one policy call per observer per step."""
        self = agent_rref.local_value()
        m = Categorical(self.policy(state.to(self.device)))
        action = m.sample()
        with self.lock:
            self.saved_log_probs[ob_id].append(m.log_prob(action))
        return int(action.item())

    @staticmethod
    @rpc.functions.async_execution
    def select_action_batch(agent_rref: rpc.RRef, ob_id: int,
                            state: torch.Tensor) -> torch.futures.Future:
        """Batched: park the state, return a future; the last arrival runs the policy once."""
        self = agent_rref.local_value()
        with self.lock:
            self.states[ob_id].copy_(state.view(-1))
            action = self.future_actions.then(lambda fut: int(fut.value()[ob_id]))
            self.pending -= 1
            full = self.pending == 0
            if full:
                self.pending = len(self.ob_rrefs)
                # clone: ``states`` is overwritten in place next step, and autograd needs
                # this step's input for the backward pass at the end of the episode
                m = Categorical(self.policy(self.states.clone()))
                actions = m.sample()
                self.saved_log_probs.append(m.log_prob(actions))
                step_future, self.future_actions = self.future_actions, torch.futures.Future()
        if full:
            step_future.set_result(actions.cpu())  # answers every observer waiting on it
        return action

    def run_episode(self, n_steps: int) -> tuple[float, float]:
        """One episode on every observer at once, then one policy-gradient step."""
        futs = [r.rpc_async().run_episode(self.agent_rref, n_steps) for r in self.ob_rrefs]
        rets = torch.futures.wait_all(futs)
        returns = torch.stack([ret[0] for ret in rets]).to(self.device)  # (observers, steps)
        game_len = sum(ret[1] for ret in rets) / len(rets)
        if self.batch:
            log_probs = torch.stack(self.saved_log_probs, dim=1)  # steps x (observers,)
        else:
            log_probs = torch.stack([torch.cat(self.saved_log_probs[i])
                                     for i in range(len(rets))])
        loss = -(log_probs * returns).sum() / len(rets)
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.saved_log_probs = [] if self.batch else {i: [] for i in range(len(rets))}
        self.running_reward = 0.5 * game_len + 0.5 * self.running_reward
        return game_len, self.running_reward

    def close(self) -> None:
        """Drop the RRefs (to self and to the observers) before the world goes away."""
        self.ob_rrefs = []
        self.agent_rref = None  # type: ignore[assignment]


def run_config(observers: Sequence[str], batch: bool, episodes: int, steps: int,
               seed: int = 543, gamma: float = 1.0, warmup_steps: int = 10,
               device: str = "cpu") -> float:
    """Seconds for ``episodes`` episodes of ``steps`` steps, one observer per name given.

    Runs on rank 0, which owns the agent. The clock starts once every observer is built and
    one untimed episode of ``warmup_steps`` steps has run, so world start-up, ``import
    gymnasium`` and first-call costs on the workers are not counted.
    """
    agent = Agent(observers, batch=batch, seed=seed, gamma=gamma, device=device)
    try:
        agent.wait_ready()
        if warmup_steps:
            agent.run_episode(warmup_steps)
        t0 = time.perf_counter()
        for _ in range(episodes):
            agent.run_episode(steps)
        return time.perf_counter() - t0
    finally:
        agent.close()


def record(observers: int, mode: str, seconds: float, **extra: Any) -> dict:
    """Keep one timing in ``RESULTS`` and send it to ``nbdist.log`` (for a dashboard)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    row = {"observers": int(observers), "mode": mode, "seconds": float(seconds), **extra}
    RESULTS.append(row)
    log(batching_observers=row["observers"], batching_mode=mode, batching_seconds=row["seconds"])
    return row


def _latest(rows: Sequence[dict]) -> dict[tuple[int, str], float]:
    return {(r["observers"], r["mode"]): r["seconds"] for r in rows}


def table(rows: Sequence[dict]) -> list[dict]:
    """One row per observer count: seconds batched, seconds unbatched, speed-up (if both)."""
    t = _latest(rows)
    out = []
    for n in sorted({n for n, _ in t}):
        b, u = t.get((n, "batched")), t.get((n, "unbatched"))
        out.append({"observers": n, "batched s": b, "unbatched s": u,
                    "speed-up": u / b if b and u else None})
    return out


def plot_results(ax: Any, rows: Sequence[dict], title: str = "") -> None:
    """Draw (or redraw) grouped bars: seconds per observer count, batched vs unbatched."""
    t = _latest(rows)
    counts = sorted({n for n, _ in t})
    ax.clear()
    width = 0.4
    for k, mode in enumerate(MODES):
        xs = [i + (k - 0.5) * width for i, n in enumerate(counts) if (n, mode) in t]
        ys = [t[(n, mode)] for n in counts if (n, mode) in t]
        ax.bar(xs, ys, width, label=mode, color=("tab:blue", "tab:orange")[k])
    ax.set_xticks(range(len(counts)), [str(n) for n in counts])
    ax.set_xlabel("observers")
    ax.set_ylabel("seconds")
    ax.set_title(title or "time per configuration")
    if t:
        ax.legend(loc="upper left")


def write_csv(rows: Sequence[dict], path: str) -> str:
    """Write ``observers, mode, seconds`` rows (plus any extra keys) to ``path``."""
    cols: list[str] = []
    for r in rows:
        cols.extend(k for k in r if k not in cols)
    return _write_csv(path, cols, rows)
