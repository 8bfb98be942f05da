"""serving/admission.py's parts that need no live server (tests/serving/test_hostile.py drives the rest over
sockets): the body budget's waiting, the admin token's sources and refusals, and the bearer check."""
import argparse
import asyncio
import re

import pytest

from mindvl.cli import serving
from mindvl.errors import ConfigError
from mindvl.serving.admission import BodyBudget, authorized, read_admin_token


def test_a_body_waits_for_room_in_the_budget_and_a_given_up_wait_holds_nothing():
    async def scenario():
        budget = BodyBudget(10)
        await budget.acquire(6)
        with pytest.raises(asyncio.TimeoutError):
            await asyncio.wait_for(budget.acquire(6), 0.05)  # no room: the wait ends unanswered
        assert budget.held == 6
        waiting = asyncio.ensure_future(budget.acquire(6))
        await asyncio.sleep(0)
        assert not waiting.done()
        budget.release(6)
        await waiting
        assert budget.held == 6  # the first share released, the second held

    asyncio.run(scenario())


def test_the_admin_token_comes_from_a_file_or_the_environment_never_empty(tmp_path, monkeypatch):
    token_file = tmp_path / "token"
    token_file.write_text("s3cret-token\n")
    monkeypatch.setenv("MINDVL_TEST_TOKEN", "env-token")
    assert read_admin_token(str(token_file), "") == b"s3cret-token"
    assert read_admin_token("", "MINDVL_TEST_TOKEN") == b"env-token"
    assert read_admin_token("", "") is None  # the admin endpoints stay off
    (tmp_path / "empty").write_text("\n")
    monkeypatch.setenv("MINDVL_TEST_EMPTY", "")
    for path, env, message in (
            (str(tmp_path / "empty"), "", f"admin_token_file {tmp_path / 'empty'}: empty or unset; put a long random "
                                          f"token there (`openssl rand -hex 32`)"),
            ("", "MINDVL_TEST_EMPTY", "admin_token_env: environment variable MINDVL_TEST_EMPTY: empty or unset"),
            ("", "MINDVL_TEST_UNSET_VARIABLE", "environment variable MINDVL_TEST_UNSET_VARIABLE: empty or unset"),
            (str(tmp_path / "absent"), "", f"admin_token_file: {tmp_path / 'absent'}: no such file"),
            (str(token_file), "MINDVL_TEST_TOKEN", "give the token one way, not both")):
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            read_admin_token(path, env)


def test_no_serve_flag_carries_the_admin_token_itself():
    """`ps` shows a command line to every user: the token is named by a file or a variable only."""
    commands = argparse.ArgumentParser().add_subparsers()
    serving.register(commands)
    flags = set(re.findall(r"--[\w-]*token(?!s)[\w-]*", commands.choices["serve"].format_help()))  # not counts of
    # tokens (--speculative-tokens)
    assert flags == {"--admin-token-file", "--admin-token-env"}


@pytest.mark.parametrize("header, accepted", [
    ("Bearer right-token", True), ("bearer right-token", True), ("Bearer  right-token ", True),
    ("Bearer wrong-token", False), ("Bearer right-tokenx", False), ("Basic right-token", False), ("", False),
    ("right-token", False), ("Bearer", False)])
def test_only_the_bearer_token_itself_is_authorized(header, accepted):
    assert authorized(header, b"right-token") is accepted
