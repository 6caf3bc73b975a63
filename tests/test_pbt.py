"""PBT's exploit and explore steps against Ray Tune's rules, worked out by hand: the quantiles,
who copies whom, how a value is perturbed or resampled, and when a point is due."""

import numpy as np
import pytest
from pydantic import ValidationError

from marl_core.pbt.schedule import due, exploit_and_explore, explore, quantiles
from marl_core.pbt.settings import PBTSettings


def _settings(**values) -> PBTSettings:
    return PBTSettings(
        **{"perturbation_interval": 5, "hyperparam_mutations": {"lr": {"loguniform": [1e-5, 1e-2]}}, **values}
    )


def test_quantiles_are_a_rounded_up_fraction_and_at_most_half():
    scores = [3.0, 9.0, 1.0, 7.0, 5.0, 8.0, 2.0, 6.0]
    assert quantiles(scores, 0.25) == ([2, 6], [5, 1])  # ceil(8 x 0.25) = 2: worst first, best last
    assert quantiles(scores, 0.25, mode="min") == ([1, 5], [6, 2])
    assert quantiles([1.0, 2.0, 3.0], 0.5) == ([0], [2])  # ceil(1.5) = 2 is above half: floor(1.5) = 1
    assert quantiles([1.0, 2.0, 3.0, 4.0], 0.1) == ([0], [3])  # ceil(0.4) = 1
    assert quantiles([1.0], 0.5) == ([], [])
    assert quantiles([1.0, 2.0], 0.0) == ([], [])


def test_a_perturbed_value_is_multiplied_by_a_factor_and_an_integer_stays_one():
    settings = _settings(
        resample_probability=0.0, hyperparam_mutations={"lr": {"uniform": [0, 1]}, "epochs": {"randint": [1, 100]}}
    )
    rng = np.random.default_rng(0)
    seen_lr, seen_epochs = set(), set()
    for _ in range(200):
        explored = explore({"lr": 0.5, "epochs": 7, "other": "kept"}, settings, rng)
        seen_lr.add(round(explored["lr"], 12))
        seen_epochs.add(explored["epochs"])
        assert explored["other"] == "kept" and isinstance(explored["epochs"], int)
    assert seen_lr == {0.6, 0.4} and seen_epochs == {8, 5}  # int(7 x 1.2) and int(7 x 0.8): truncated, as Tune does


def test_a_list_value_moves_one_place_and_stays_in_the_list():
    settings = _settings(resample_probability=0.0, hyperparam_mutations={"batch": [32, 64, 128, 256]})
    rng = np.random.default_rng(1)
    assert {explore({"batch": 64}, settings, rng)["batch"] for _ in range(100)} == {32, 128}
    assert {explore({"batch": 32}, settings, rng)["batch"] for _ in range(100)} == {32, 64}  # clamped at the end
    assert {explore({"batch": 256}, settings, rng)["batch"] for _ in range(100)} == {128, 256}
    moved = [explore({"batch": 64}, settings, rng)["batch"] for _ in range(4000)]
    assert np.mean(np.array(moved) == 32) == pytest.approx(0.5, abs=0.03)


def test_resampling_draws_from_the_mutation_and_a_stranger_to_its_list_is_always_resampled():
    settings = _settings(
        resample_probability=1.0, hyperparam_mutations={"lr": {"loguniform": [1e-5, 1e-2]}, "batch": [32, 64]}
    )
    rng = np.random.default_rng(2)
    draws = [explore({"lr": 1.0, "batch": 32}, settings, rng) for _ in range(2000)]
    lrs = np.array([d["lr"] for d in draws])
    assert lrs.min() >= 1e-5 and lrs.max() <= 1e-2
    assert np.mean(lrs < 10**-3.5) == pytest.approx(0.5, abs=0.04)  # log-uniform: half below the log midpoint
    assert {d["batch"] for d in draws} == {32, 64}
    never = _settings(resample_probability=0.0, hyperparam_mutations={"batch": [32, 64]})
    assert {explore({"batch": 48}, never, rng)["batch"] for _ in range(50)} == {32, 64}


def test_each_bottom_member_copies_a_top_one_and_the_lineage_says_so():
    settings = _settings(quantile_fraction=0.5, resample_probability=0.0, perturbation_factors=(2.0, 2.0))
    scores = [-20.0, -5.0, -21.0, -6.0]  # members 0 and 2 trained at a learning rate that cannot learn
    hyperparams = [{"lr": 1e-7}, {"lr": 1e-3}, {"lr": 1e-7}, {"lr": 3e-4}]
    entries = exploit_and_explore(10, scores, hyperparams, settings, np.random.default_rng(3))
    assert [e.member for e in entries] == [2, 0]  # worst first
    assert all(e.source in (1, 3) for e in entries)
    for entry in entries:
        assert entry.before == {"lr": 1e-7}
        assert entry.after == {"lr": hyperparams[entry.source]["lr"] * 2.0}
        assert (entry.step, entry.member_score, entry.source_score) == (10, scores[entry.member], scores[entry.source])
    sources = [
        e.source
        for _ in range(300)
        for e in exploit_and_explore(10, scores, hyperparams, settings, np.random.default_rng(_))
    ]
    assert set(sources) == {1, 3}  # uniformly among the top


def test_points_are_due_every_interval_after_the_burn_in():
    assert [s for s in range(1, 21) if due(_settings(), s)] == [5, 10, 15, 20]
    assert [s for s in range(1, 21) if due(_settings(burn_in_period=7), s)] == [10, 15, 20]


def test_bad_settings_are_refused():
    with pytest.raises(ValidationError, match="less than or equal to 0.5"):
        _settings(quantile_fraction=0.6)
    with pytest.raises(ValidationError, match="loguniform: low 0.0 must be above 0"):
        _settings(hyperparam_mutations={"lr": {"loguniform": [0, 1]}})
    with pytest.raises(ValidationError, match=r"lr=\{.*\}: give a list of values or one of uniform"):
        _settings(hyperparam_mutations={"lr": {"uniform": [0, 1], "randint": [1, 2]}})
    with pytest.raises(ValidationError, match="lr: a list of values needs at least one value"):
        _settings(hyperparam_mutations={"lr": []})
    with pytest.raises(ValueError, match=r"member 1 has no value for the mutated hyperparameter\(s\) \['lr'\]"):
        exploit_and_explore(5, [1.0, 2.0], [{"lr": 1.0}, {}], _settings(), np.random.default_rng(0))


# --- PBT over MARL learners, in this process -----------------------------------------------------


def _pbt_config(**values):
    from marl_core.pbt.marl import PBTConfig

    marl = dict(
        env="pettingzoo:mpe2.simple_spread_v3",
        algorithm="mappo",
        rounds=4,
        steps_per_round=25,
        envs_per_worker=2,
        eval_episodes=4,
    )
    return PBTConfig(
        **{
            "marl": marl,
            "population": 4,
            "members": [{"lr": 1e-7}, {"lr": 1e-7}],
            "pbt": {
                "perturbation_interval": 2,
                "quantile_fraction": 0.5,
                "hyperparam_mutations": {"lr": {"loguniform": [1e-5, 1e-2]}},
            },
            **values,
        }
    )


def test_a_copied_learner_keeps_its_new_learning_rate():
    import torch

    from marl_core.marl.config import layout_and_spec, make_learner
    from marl_core.rl.optimizers import load_keeping_hyperparameters

    config = _pbt_config()
    layout, spec = layout_and_spec(config.marl)
    source = make_learner(config.member_config(2), layout, spec.state_size)
    copy = make_learner(config.member_config(0, {"lr": 0.00123}), layout, spec.state_size)
    load_keeping_hyperparameters(copy, source.state_dict())
    for policy, network in source.policies.items():
        for a, b in zip(network.parameters(), copy.policies[policy].parameters()):
            assert torch.equal(a, b)
    rates = {
        group["lr"]
        for o in vars(copy).values()
        for opt in (o.values() if isinstance(o, dict) else [o])
        if isinstance(opt, torch.optim.Optimizer)
        for group in opt.param_groups
    }
    assert rates == {0.00123}


def test_at_each_point_the_bottom_half_copies_the_top_half_and_the_lineage_says_so():
    from marl_core.pbt.marl import iterate_pbt_local

    rounds = list(iterate_pbt_local(_pbt_config()))
    assert [r.round for r in rounds] == [0, 1, 2, 3]
    assert rounds[0].scores() is None and rounds[0].lineage == [] and rounds[2].lineage == []
    for point, before in ((rounds[1], rounds[0]), (rounds[3], rounds[2])):
        scores = point.scores()
        order = sorted(range(4), key=lambda i: scores[i])
        assert {e.member for e in point.lineage} == set(order[:2])
        for entry in point.lineage:
            assert entry.source in order[2:] and entry.member_score == scores[entry.member] <= entry.source_score
            assert entry.before == before.hyperparameters[entry.member]
            assert point.hyperparameters[entry.member] == entry.after
    assert rounds[0].hyperparameters[:2] == [{"lr": 1e-7}, {"lr": 1e-7}]
    baseline = list(iterate_pbt_local(_pbt_config(exploit=False)))
    assert all(r.lineage == [] for r in baseline) and baseline[-1].hyperparameters[0] == {"lr": 1e-7}
    assert baseline[1].scores() == rounds[1].scores()  # the same seeds: identical up to the first copy


def test_pbt_refuses_mutations_the_algorithm_does_not_have():
    from pydantic import ValidationError

    with pytest.raises(
        ValidationError, match=r"pbt.hyperparam_mutations: \['learning_rate'\] are not settings of mappo"
    ):
        _pbt_config(pbt={"perturbation_interval": 2, "hyperparam_mutations": {"learning_rate": [0.1]}})
    with pytest.raises(ValidationError, match="members: 5 given for a population of 4"):
        _pbt_config(members=[{}] * 5)


def test_settings_read_back_from_their_own_dump():
    """A run's config is logged as JSON and read back on resume: a distribution's dump names the
    kinds it is not as None."""
    settings = _settings(hyperparam_mutations={"lr": {"loguniform": [1e-5, 1e-2]}, "epochs": [2, 4]})
    assert PBTSettings(**settings.model_dump(mode="json")) == settings


def test_settings_in_a_section_are_mutated_by_their_dotted_name():
    """IPPO keeps its PPO settings in a section: `ppo.lr` names the learning rate; a member's
    override of one setting of the section keeps the others, and a copy's explored value lands
    in the section."""
    from marl_core.pbt.marl import PBTConfig, PBTState
    from marl_core.pbt.settings import merged

    marl = dict(
        env="pettingzoo:mpe2.simple_spread_v3", algorithm="ippo", rounds=4, settings={"ppo": {"lr": 3e-4, "epochs": 2}}
    )
    config = PBTConfig(
        marl=marl,
        population=2,
        members=[{"ppo": {"lr": 1e-7}}],
        pbt={"perturbation_interval": 2, "hyperparam_mutations": {"ppo.lr": {"loguniform": [1e-5, 1e-2]}}},
    )
    assert config.hyperparameters(0) == {"ppo.lr": 1e-7} and config.hyperparameters(1) == {"ppo.lr": 3e-4}
    assert config.member_config(0).algorithm_settings.ppo.epochs == 2
    assert merged({"ppo": {"lr": 3e-4, "epochs": 2}}, {"ppo.lr": 2e-4}) == {"ppo": {"lr": 2e-4, "epochs": 2}}
    state = PBTState.initial(config)
    assert state.member_config(config, 0).algorithm_settings.ppo.lr == 1e-7
    with pytest.raises(ValidationError, match=r"\['ppo.learning_rate'\] are not settings of ippo"):
        PBTConfig(marl=marl, pbt={"perturbation_interval": 2, "hyperparam_mutations": {"ppo.learning_rate": [0.1]}})
