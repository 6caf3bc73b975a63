"""The environment adapters against the real libraries they wrap: OpenSpiel, PettingZoo, Gymnasium."""

from __future__ import annotations

import pickle

import gymnasium
import numpy as np
import pettingzoo
import pyspiel
import pytest
from mpe2 import simple_spread_v3
from pettingzoo.test import api_test, parallel_api_test

from marl_core.envs import (
    GymnasiumEnv,
    MultiAgentEnv,
    OpenSpielEnv,
    PettingZooAECEnv,
    PettingZooParallelEnv,
    TimeStep,
    by_prefix,
    from_dict,
    group_by_policy,
    make_env,
    one_population_per_agent,
    shared_population,
    to_pettingzoo,
)
from marl_core.games.openspiel import GameError

# PettingZoo's API tests warn about things that are fine here (unbounded Box, no render()).
quiet_api_test = pytest.mark.filterwarnings("ignore::UserWarning")


def tictactoe() -> pettingzoo.AECEnv:
    return pettingzoo.make("aec", "classic/tictactoe-v3")


def random_actions(step: TimeStep, rng: np.random.Generator) -> dict[str, int]:
    return {agent: int(rng.choice(np.flatnonzero(mask))) for agent, mask in step.action_masks.items()}


def step_kinds(step: TimeStep) -> set[str]:
    """How each agent of the episode stands: terminated, truncated or live."""
    return {
        "terminated" if step.terminations[a] else "truncated" if step.truncations[a] else "live" for a in step.rewards
    }


def play(env: MultiAgentEnv, seed: int, rng: np.random.Generator) -> tuple[list[TimeStep], dict[str, float]]:
    """One episode with random legal actions: its TimeSteps and each agent's total reward."""
    steps = [env.reset(seed=seed)]
    while not steps[-1].done:
        steps.append(env.step(random_actions(steps[-1], rng)))
    totals: dict[str, float] = {}
    for step in steps:
        for agent, reward in step.rewards.items():
            totals[agent] = totals.get(agent, 0.0) + reward
    return steps, totals


# --- OpenSpiel ---------------------------------------------------------------------------------


def test_kuhn_matches_pyspiel_step_by_step():
    env = OpenSpielEnv("kuhn_poker")
    step = env.reset(seed=3)
    assert all(r == 0.0 for r in step.rewards.values())
    replay = pyspiel.load_game("kuhn_poker").new_initial_state()
    for action in env.game_state.history()[:2]:  # the two deals the environment sampled
        replay.apply_action(action)
    for action in [1, 1]:  # bet, call: a showdown
        p = replay.current_player()
        agent = f"player_{p}"
        assert step.acting == (agent,)
        np.testing.assert_array_equal(step.observations[agent], replay.information_state_tensor(p))
        assert step.observations[agent].dtype == np.float32
        np.testing.assert_array_equal(step.action_masks[agent], np.array(replay.legal_actions_mask(p), bool))
        assert step.infos[agent]["infostate"] == replay.information_state_string(p)
        assert not step.done
        step = env.step({agent: action})
        replay.apply_action(action)
    assert step.done and replay.is_terminal()
    assert step.observations == {} and step.action_masks == {}
    assert step.terminations == {"player_0": True, "player_1": True}
    assert step.truncations == {"player_0": False, "player_1": False}
    assert [step.rewards["player_0"], step.rewards["player_1"]] == replay.returns()
    assert env.spec.observation_size == {"player_0": 11, "player_1": 11}
    assert env.spec.num_actions == {"player_0": 2, "player_1": 2} and not env.spec.simultaneous


def test_seeded_reset_replays_the_deals():
    env = OpenSpielEnv("leduc_poker")

    def deal(seed: int) -> tuple[int, ...]:
        env.reset(seed=seed)
        return tuple(env.game_state.history())  # the two private cards

    deals = [deal(seed) for seed in range(6)]
    assert deals == [deal(seed) for seed in range(6)] and len(set(deals)) > 1
    # An unseeded reset continues the stream the constructor's seed started.
    a, b = OpenSpielEnv("leduc_poker", seed=5), OpenSpielEnv("leduc_poker", seed=5)
    for _ in range(5):
        a.reset(), b.reset()
        assert a.game_state.history() == b.game_state.history()


def test_rewards_sum_to_returns_over_random_episodes():
    env, rng = OpenSpielEnv("leduc_poker"), np.random.default_rng(0)
    for seed in range(20):
        steps, totals = play(env, seed, rng)
        assert [totals[a] for a in env.spec.agents] == env.game_state.returns()
        assert all(r == 0.0 for step in steps[:-1] for r in step.rewards.values())  # poker pays at the end


def test_rewards_along_the_way_are_per_step():
    env = OpenSpielEnv("cliff_walking")  # -1 a step, -100 for the cliff
    steps, totals = play(env, seed=0, rng=np.random.default_rng(0))
    assert all(step.rewards["player_0"] < 0 for step in steps[1:])
    assert totals["player_0"] == env.game_state.returns()[0]


def test_simultaneous_matrix_game_pays_both_players():
    env = OpenSpielEnv("matrix_rps")
    assert env.spec.simultaneous
    step = env.reset()
    assert step.acting == ("player_0", "player_1")
    assert set(step.infos) == {"player_0", "player_1"}
    step = env.step({"player_0": 0, "player_1": 1})  # rock loses to paper
    assert step.done and step.rewards == {"player_0": -1.0, "player_1": 1.0}


def test_goofspiel_all_players_act_at_once():
    env, rng = OpenSpielEnv("goofspiel(num_cards=3)"), np.random.default_rng(1)
    steps, totals = play(env, seed=0, rng=rng)
    assert len(steps) == 3  # two bids; the game plays the last, forced, card itself
    assert all(step.acting == ("player_0", "player_1") for step in steps[:-1])
    assert [totals["player_0"], totals["player_1"]] == env.game_state.returns()


def test_step_rejects_wrong_agent_illegal_action_and_finished_episode():
    env = OpenSpielEnv("kuhn_poker")
    assert env.reset(seed=0).acting == ("player_0",)
    with pytest.raises(ValueError, match="agent 'player_1' is not acting"):
        env.step({"player_1": 0})
    with pytest.raises(ValueError, match="no action"):
        env.step({})
    with pytest.raises(ValueError, match=r"illegal action 7 for agent 'player_0'"):
        env.step({"player_0": 7})
    env.step({"player_0": 0})
    env.step({"player_1": 0})  # check, check: the episode is over
    with pytest.raises(ValueError, match="call reset"):
        env.step({"player_0": 0})
    leduc = OpenSpielEnv("leduc_poker")
    step = leduc.reset(seed=0)
    illegal = int(np.flatnonzero(~step.action_masks["player_0"])[0])  # fold before any bet
    with pytest.raises(ValueError, match=f"illegal action {illegal} for agent 'player_0'"):
        leduc.step({"player_0": illegal})
    rps = OpenSpielEnv("matrix_rps")
    rps.reset()
    with pytest.raises(ValueError, match=r"no action for acting agent\(s\) \['player_1'\]"):
        rps.step({"player_0": 0})


# --- PettingZoo --------------------------------------------------------------------------------


@quiet_api_test
def test_tictactoe_aec_adapter_against_the_raw_env():
    api_test(tictactoe(), num_cycles=100)
    env, raw = PettingZooAECEnv(tictactoe()), tictactoe()
    assert env.spec.observation_size == {"player_1": 18, "player_2": 18} and not env.spec.simultaneous
    rng, outcomes = np.random.default_rng(0), set()
    for seed in range(5):
        step, raw_totals, totals = env.reset(seed=seed), {}, {}
        raw.reset(seed=seed)
        while not step.done:
            (agent,) = step.acting
            assert agent == raw.agent_selection
            raw_observation = raw.observe(agent)
            np.testing.assert_array_equal(step.observations[agent], raw_observation["observation"].ravel())
            np.testing.assert_array_equal(step.action_masks[agent], raw_observation["action_mask"].astype(bool))
            illegal = np.flatnonzero(~step.action_masks[agent])
            if illegal.size:
                with pytest.raises(ValueError, match=f"illegal action {illegal[0]}"):
                    env.step({agent: int(illegal[0])})
            actions = random_actions(step, rng)
            step = env.step(actions)
            raw.step(actions[agent])
            while raw.agents:  # PettingZoo's own loop: finished agents step with None
                for a, r in raw.rewards.items():
                    raw_totals[a] = raw_totals.get(a, 0.0) + r
                if not (raw.terminations[raw.agent_selection] or raw.truncations[raw.agent_selection]):
                    break
                raw.step(None)
            for a, r in step.rewards.items():
                totals[a] = totals.get(a, 0.0) + r
        assert totals == raw_totals and set(step.terminations.values()) == {True}
        outcomes.add(totals["player_1"])
    assert outcomes - {0.0}  # some games were won, not all drawn


@quiet_api_test
def test_rps_aec_adapter_flattens_discrete_observations():
    api_test(pettingzoo.make("aec", "classic/rps-v2"), num_cycles=20)
    env = PettingZooAECEnv(pettingzoo.make("aec", "classic/rps-v2", num_actions=3, max_cycles=4))
    assert env.spec.observation_size == {"player_0": 4, "player_1": 4}  # Discrete(4), one-hot
    steps, totals = play(env, seed=0, rng=np.random.default_rng(0))
    assert len(steps) == 9 and all(len(step.acting) == 1 for step in steps[:-1])
    assert totals["player_0"] == -totals["player_1"]
    assert step_kinds(steps[-1]) == {"truncated"}


@quiet_api_test
def test_simple_spread_parallel_adapter_against_the_raw_env():
    parallel_api_test(simple_spread_v3.parallel_env(), num_cycles=50)
    env, raw = PettingZooParallelEnv(simple_spread_v3.parallel_env()), simple_spread_v3.parallel_env()
    assert env.spec.simultaneous and env.spec.observation_size == dict.fromkeys(env.spec.agents, 18)
    rng = np.random.default_rng(0)
    step = env.reset(seed=4)
    raw_observations, _ = raw.reset(seed=4)
    steps = 0
    while not step.done:
        assert step.acting == ("agent_0", "agent_1", "agent_2")
        for agent in step.acting:
            np.testing.assert_array_equal(step.observations[agent], raw_observations[agent])
            assert step.action_masks[agent].all() and step.action_masks[agent].shape == (5,)
        actions = random_actions(step, rng)
        step = env.step(actions)
        raw_observations, raw_rewards, *_ = raw.step(actions)
        assert step.rewards == {a: float(r) for a, r in raw_rewards.items()}
        steps += 1
    assert steps == 25 and step_kinds(step) == {"truncated"}
    # the steps above ran without PettingZoo's checking wrappers; the adapter checks actions itself
    assert type(env.env.aec_env) is simple_spread_v3.raw_env
    env.reset(seed=0)
    with pytest.raises(ValueError, match=r"illegal action 5 for agent 'agent_0'; legal actions: \[0, 1, 2, 3, 4\]"):
        env.step({"agent_0": 5, "agent_1": 0, "agent_2": 0})


def test_simple_spread_aec_adapter_steps_truncated_agents_out():
    env = PettingZooAECEnv(simple_spread_v3.env(max_cycles=3))
    steps, _ = play(env, seed=0, rng=np.random.default_rng(0))
    assert len(steps) == 10  # 3 cycles of 3 agents, then the final TimeStep
    assert step_kinds(steps[-1]) == {"truncated"} and env.env.agents == []


# --- Gymnasium, NaN rewards --------------------------------------------------------------------


def test_cartpole_truncation_passes_through():
    env, raw = GymnasiumEnv(gymnasium.make("CartPole-v1", max_episode_steps=5)), gymnasium.make("CartPole-v1")
    step = env.reset(seed=0)
    raw_observation, _ = raw.reset(seed=0)
    assert env.spec.agents == ("agent_0",) and env.spec.num_actions == {"agent_0": 2}
    for t in range(5):
        np.testing.assert_array_equal(step.observations["agent_0"], raw_observation)
        action = t % 2
        step = env.step({"agent_0": action})
        raw_observation, *_ = raw.step(action)
    assert step.done and step.truncations == {"agent_0": True} and step.terminations == {"agent_0": False}
    assert step.rewards == {"agent_0": 1.0}


def test_continuous_actions_are_refused():
    with pytest.raises(ValueError, match="not Discrete"):
        GymnasiumEnv(gymnasium.make("Pendulum-v1"))


class NaNRewardEnv(gymnasium.Env):
    """Pays NaN on its third step."""

    observation_space = gymnasium.spaces.Box(-1.0, 1.0, (2,), np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float("nan") if self.t == 3 else 1.0, False, False, {}


def test_nan_reward_raises_naming_env_and_step():
    env = GymnasiumEnv(NaNRewardEnv())
    env.reset(seed=0)
    env.step({"agent_0": 0})
    env.step({"agent_0": 1})
    with pytest.raises(ValueError, match=r"NaNRewardEnv: non-finite reward nan for agent 'agent_0' at step 3"):
        env.step({"agent_0": 0})


# --- Export to PettingZoo ----------------------------------------------------------------------


@quiet_api_test
@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker", "goofspiel(num_cards=3)"])
def test_exported_openspiel_env_passes_pettingzoo_api_test(game):
    api_test(to_pettingzoo(OpenSpielEnv(game, seed=0)), num_cycles=200)


@quiet_api_test
def test_round_trip_through_pettingzoo_keeps_the_game():
    api_test(to_pettingzoo(PettingZooAECEnv(tictactoe())), num_cycles=100)
    api_test(to_pettingzoo(PettingZooParallelEnv(simple_spread_v3.parallel_env(max_cycles=5))), num_cycles=100)
    exported = to_pettingzoo(OpenSpielEnv("kuhn_poker"))
    exported.reset(seed=1)
    assert exported.possible_agents == ["player_0", "player_1"]
    for action in [1, 0]:  # player_0 bets, player_1 folds: player_0 wins player_1's ante
        assert exported.infos[exported.agent_selection]["action_mask"].tolist() == [1, 1]
        exported.step(action)
    assert exported.rewards == {"player_0": 1.0, "player_1": -1.0}
    assert all(exported.terminations.values())


# --- Agent mappings and make_env ---------------------------------------------------------------


def test_agent_mappings_group_agents_and_pickle():
    agents = ["adversary_0", "agent_0", "agent_1"]
    assert group_by_policy(agents, one_population_per_agent) == {a: [a] for a in agents}
    assert group_by_policy(agents, shared_population("main")) == {"main": agents}
    roles = by_prefix({"a": "other", "adversary": "red", "agent": "blue"})  # the longest prefix wins
    assert group_by_policy(agents, roles) == {"red": ["adversary_0"], "blue": ["agent_0", "agent_1"]}
    table = from_dict({"agent_0": "x", "agent_1": "x", "adversary_0": "y"})
    assert group_by_policy(agents, table) == {"y": ["adversary_0"], "x": ["agent_0", "agent_1"]}
    for mapping in (shared_population("main"), roles, table):
        assert pickle.loads(pickle.dumps(mapping))("agent_0") == mapping("agent_0")
    with pytest.raises(KeyError, match="landmark_0"):
        table("landmark_0")
    with pytest.raises(KeyError, match="landmark_0"):
        by_prefix({"agent": "blue"})("landmark_0")


def test_make_env_routes_by_prefix():
    assert isinstance(make_env("kuhn_poker"), OpenSpielEnv)
    assert isinstance(make_env("pettingzoo:mpe2.simple_spread_v3"), PettingZooParallelEnv)
    assert isinstance(make_env("pettingzoo:classic/tictactoe-v3"), PettingZooAECEnv)
    assert isinstance(make_env("pettingzoo:classic/rps-v2"), PettingZooParallelEnv)
    assert isinstance(make_env("gymnasium:CartPole-v1"), GymnasiumEnv)
    for bad, message in [
        ("pettingzoo:no_such.module", "'pettingzoo:no_such.module'.*SOURCE:NAME"),
        ("pettingzoo:classic/no_such-v1", "'pettingzoo:classic/no_such-v1'.*not found in registry"),
        ("gymnasium:NoSuchEnv-v0", "'gymnasium:NoSuchEnv-v0'.*SOURCE one of: atari, gymnasium, pettingzoo, vmas"),
        ("ray:kuhn_poker", "'ray:kuhn_poker'.*OpenSpiel game string"),
    ]:
        with pytest.raises(ValueError, match=message) as error:
            make_env(bad)
        assert "\n" not in str(error.value)
    with pytest.raises(GameError, match="no_such_game"):
        make_env("no_such_game")
