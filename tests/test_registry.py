"""jaxsearch.registry.Registry: register once, get with an error naming the kind, the name and the known names."""

import pytest

from jaxsearch.registry import Registry, UnknownNameError


def test_register_get_and_names():
    reg = Registry("widget")

    @reg.register("b")
    def b():
        return "b"

    reg.add("a", "entry a")
    assert reg.get("b") is b and reg["a"] == "entry a"
    assert reg.names() == ["a", "b"]
    assert "a" in reg and "c" not in reg
    assert sorted(reg) == ["a", "b"] and len(reg) == 2
    del reg["a"]
    assert reg.names() == ["b"]


def test_unknown_name_names_the_kind_the_name_and_the_known_names():
    reg = Registry("widget", {"alpha": 1, "beta": 2})
    with pytest.raises(ValueError) as error:
        reg.get("gamma")
    assert str(error.value) == "unknown widget 'gamma'; known: ['alpha', 'beta']"
    with pytest.raises(KeyError, match="unknown widget 'gamma'"):  # a mapping's error for reg[name]
        reg["gamma"]
    assert isinstance(error.value, UnknownNameError)


def test_a_name_registers_once():
    reg = Registry("widget", {"alpha": 1})
    with pytest.raises(ValueError, match="widget 'alpha' is already registered"):
        reg.register("alpha")(lambda: None)
    with pytest.raises(ValueError, match="already registered"):
        Registry("widget", {"x": 1}).add("x", 2)
    assert reg.get("alpha") == 1


def test_the_four_registries_keep_their_errors():
    from jaxsearch.agent.protocols import get_protocol
    from jaxsearch.rl.advantages import get_advantage_fn
    from jaxsearch.rl.losses import get_policy_loss
    from jaxsearch.scoring.rewards import get_reward

    for get, kind, known in [
        (get_protocol, "protocol", "search_r1"),
        (get_advantage_fn, "advantage estimator", "grpo"),
        (get_policy_loss, "policy loss", "ppo"),
        (get_reward, "reward", "em"),
    ]:
        with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; known: .*'{known}'"):
            get("nope")
