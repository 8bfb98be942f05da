"""Each setting with a fixed set of values is defined once (mindvl.choices): the recipe's defaults, the
checks and the command line's choices all read it."""
import pytest

from mindvl import choices
from mindvl.choices import KERNELS, LITE_BACKENDS, Choice
from mindvl.config import TrainConfig, load_config
from mindvl.errors import ConfigError


def test_every_choice_holds_its_default_and_refuses_by_key():
    for choice in (value for value in vars(choices).values() if isinstance(value, Choice)):
        assert choice.default in choice.values
    with pytest.raises(ConfigError, match=r"^train\.kernels: expected one of \['auto', 'standard', 'fused'\], got 'fast'$"):
        KERNELS.check("train.kernels", "fast")
    assert KERNELS.check("kernels", "fused") == "fused"


def test_the_recipe_the_cli_and_the_device_read_the_same_values():
    from mindvl.cli.main import build_parser
    from mindvl.lite.lite_model import BACKENDS

    assert TrainConfig().kernels == KERNELS.default
    with pytest.raises(ConfigError, match=r"train\.kernels: expected one of \['auto', 'standard', 'fused'\]"):
        load_config("tiny", ["train.kernels=fast"])
    generate = build_parser()._subparsers._group_actions[0].choices["generate"]
    kernels = next(action for action in generate._actions if action.dest == "kernels")
    assert tuple(kernels.choices) == KERNELS.values and kernels.default == KERNELS.default
    assert ("auto", *BACKENDS) == LITE_BACKENDS.values
