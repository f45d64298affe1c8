"""The RPC tutorial's RL example (Policy, Observer, Agent) in an IPython shell, through the magics.

The classes are defined by ``run_cell`` in the shell's ``__main__``, just as notebook cells
define them, so the workers can only get them by value. The agent is the shell (rank 0); it
builds an observer on each worker with ``rpc.remote`` and hands them an ``RRef`` to itself, and
the observers call ``select_action`` and ``report_reward`` back through it (nested RPCs).
CartPole-v1 comes from gymnasium (``reset(seed=...)``, five-tuple ``step``).
"""

from __future__ import annotations

import os

import pytest

TUTORIAL = '''
import os

import gymnasium as gym
import numpy as np
import torch
import torch.distributed.rpc as rpc
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim
from torch.distributed.rpc import RRef, remote, rpc_async, rpc_sync
from torch.distributions import Categorical

import nbdist

GAMMA, SEED, N_STEPS = 0.99, 543, 60


def _call_method(method, rref, *args, **kwargs):
    return method(rref.local_value(), *args, **kwargs)


def _remote_method(method, rref, *args, **kwargs):
    return rpc_sync(rref.owner(), _call_method, args=[method, rref, *args], kwargs=kwargs)


class Policy(nn.Module):
    def __init__(self):
        super().__init__()
        self.affine1 = nn.Linear(4, 128)
        self.dropout = nn.Dropout(p=0.6)
        self.affine2 = nn.Linear(128, 2)

    def forward(self, x):
        return F.softmax(self.affine2(F.relu(self.dropout(self.affine1(x)))), dim=1)


class Observer:
    def __init__(self):
        self.id = rpc.get_worker_info().id
        self.env = gym.make("CartPole-v1")
        self.first = True
        self.log = []

    def run_episode(self, agent_rref, n_steps):
        state, _ = self.env.reset(seed=SEED + self.id if self.first else None)
        self.first = False
        total = 0.0
        for _ in range(n_steps):
            action = _remote_method(Agent.select_action, agent_rref, self.id, state)
            state, reward, terminated, truncated, _ = self.env.step(action)
            _remote_method(Agent.report_reward, agent_rref, self.id, reward)
            total += reward
            if terminated or truncated:
                break
        self.log.append((os.getpid(), total))
        print(f"observer {self.id} finished an episode: reward {total:.0f}")
        return total

    def get_log(self):
        return self.log


class Agent:
    def __init__(self, world_size):
        self.ob_rrefs = []
        self.agent_rref = RRef(self)
        self.rewards = {}
        self.saved_log_probs = {}
        self.policy = Policy()
        self.optimizer = optim.Adam(self.policy.parameters(), lr=1e-2)
        self.eps = np.finfo(np.float32).eps.item()
        self.running_reward = 0.0
        self.reward_threshold = gym.make("CartPole-v1").spec.reward_threshold
        for ob_rank in range(1, world_size):
            ob_info = rpc.get_worker_info(f"obs{ob_rank}")
            self.ob_rrefs.append(remote(ob_info, Observer))
            self.rewards[ob_info.id] = []
            self.saved_log_probs[ob_info.id] = []

    def select_action(self, ob_id, state):
        state = torch.from_numpy(state).float().unsqueeze(0)
        m = Categorical(self.policy(state))
        action = m.sample()
        self.saved_log_probs[ob_id].append(m.log_prob(action))
        return action.item()

    def report_reward(self, ob_id, reward):
        self.rewards[ob_id].append(reward)

    def run_episode(self, n_steps):
        futs = [rpc_async(r.owner(), _call_method,
                          args=(Observer.run_episode, r, self.agent_rref, n_steps))
                for r in self.ob_rrefs]
        return [f.wait() for f in futs]

    def finish_episode(self):
        # as in the tutorial: discounted over all observers' rewards joined (notebook 01
        # discounts within each observer's episode instead, which trains far better)
        probs, rewards = [], []
        for ob_id in self.rewards:
            probs.extend(self.saved_log_probs[ob_id])
            rewards.extend(self.rewards[ob_id])
        min_reward = min(sum(r) for r in self.rewards.values())
        self.running_reward = 0.05 * min_reward + 0.95 * self.running_reward
        for ob_id in self.rewards:
            self.rewards[ob_id], self.saved_log_probs[ob_id] = [], []
        R, returns = 0.0, []
        for r in rewards[::-1]:
            R = r + GAMMA * R
            returns.insert(0, R)
        returns = torch.tensor(returns)
        returns = (returns - returns.mean()) / (returns.std() + self.eps)
        loss = torch.cat([-lp * R for lp, R in zip(probs, returns)]).sum()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        return min_reward


torch.manual_seed(SEED)
agent = Agent(nbdist.current().world_size)
episode_rewards, last_rewards = [], []
for i_episode in range(1, 3):
    episode_rewards.append(agent.run_episode(N_STEPS))
    last_rewards.append(agent.finish_episode())
    nbdist.log(step=i_episode, reward=last_rewards[-1])
observer_logs = [r.rpc_sync().get_log() for r in agent.ob_rrefs]
'''


@pytest.mark.slow  # the tutorial's whole run through the magics: ~3 s
@pytest.mark.timeout(300)
def test_tutorial_rl_through_magics(ipython, capsys):
    import nbdist

    nbdist.clear_history()
    ipython.run_line_magic("dist_start", "2 --name agent --worker-name obs{rank}")
    assert nbdist.current().names == ["agent", "obs1", "obs2"]

    result = ipython.run_cell(TUTORIAL)
    if not result.success:
        raise result.error_in_exec or result.error_before_exec
    ns = ipython.user_ns
    # the classes really were notebook-style: defined in the shell's __main__
    assert ns["Observer"].__module__ == "__main__"
    assert ns["Agent"].__module__ == "__main__"

    episode_rewards, last_rewards = ns["episode_rewards"], ns["last_rewards"]
    assert len(episode_rewards) == 2 and all(len(e) == 2 for e in episode_rewards)
    for per_obs, last in zip(episode_rewards, last_rewards, strict=True):
        assert all(1 <= r <= 60 for r in per_obs), per_obs
        assert last == min(per_obs)
    assert 0 < ns["agent"].running_reward <= 60
    # every observer played both episodes, in a process of its own
    pids = set()
    for log, rewards in zip(ns["observer_logs"], zip(*episode_rewards, strict=True), strict=True):
        assert [r for _, r in log] == list(rewards)
        pids |= {pid for pid, _ in log}
    assert len(pids) == 2 and os.getpid() not in pids
    assert pids == set(nbdist.current().worker_pids())
    # the agent learned from what it was told: the saved data was used and cleared
    assert all(not v for v in ns["agent"].rewards.values())
    assert all(not v for v in ns["agent"].saved_log_probs.values())
    assert [r["reward"] for r in nbdist.history(rank=0, key="reward")] == last_rewards

    lines = [f"[obs{i}] observer {i} finished an episode" for i in (1, 2)]
    assert nbdist.current().flush(timeout=60)  # what the observers printed has arrived
    out = capsys.readouterr().out
    for line in lines:
        assert out.count(line) == 2, out

    ipython.run_line_magic("dist_stop", "")
    assert nbdist.current() is None
