"""Secrets never reach what podguard writes or prints."""

from __future__ import annotations

import os
import stat

import pytest

from podguard.redact import MASK, is_secret_name, redact_argv, redact_env, redact_text
from podguard.state import write_private

HF = "hf_" + "a" * 34


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["--hf_token", HF, "--lr", "3"], ["--hf_token", MASK, "--lr", "3"]),
        (["--api-key=abc"], [f"--api-key={MASK}"]),
        (["WANDB_API_KEY=123"], [f"WANDB_API_KEY={MASK}"]),
        (["--password", "p w"], ["--password", MASK]),
        (["--cache-key", "model=llama"], ["--cache-key", "model=llama"]),
        (["--max-new-tokens", "512"], ["--max-new-tokens", "512"]),
        (["--keyfile", "/k.pem"], ["--keyfile", "/k.pem"]),
        ([f"--model={HF}"], [f"--model={MASK}"]),
        (["https://user:pw@host/x"], [f"https://user:{MASK}@host/x"]),
    ],
)
def test_argv(argv: list[str], expected: list[str]) -> None:
    assert redact_argv(argv) == expected


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("HF_TOKEN", True),
        ("RUNPOD_API_KEY", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("--auth-token", True),
        ("DB_PASSWORD", True),
        ("--max-tokens", False),
        ("--tokenizer", False),
        ("--author", False),
        ("PUBLIC_KEY", False),
        ("--cache-key", False),
        ("num_keys", False),
    ],
)
def test_secret_names(name: str, secret: bool) -> None:
    assert is_secret_name(name) is secret


def test_text_masks_options_assignments_and_token_formats() -> None:
    line = f'python t.py --wandb_key abcd --password="x y" HF_TOKEN={HF} -H "Authorization: Bearer abcdefghijkl" --lr 3'
    out = redact_text(line)
    for secret in ("abcd ", '"x y"', HF, "abcdefghijkl"):
        assert secret not in out
    assert "--lr 3" in out and "python t.py" in out


def test_text_keeps_prose() -> None:
    assert redact_text("token expires soon; 512 tokens") == "token expires soon; 512 tokens"


def test_env() -> None:
    assert redact_env({"HF_TOKEN": "x", "PATH": "/bin", "NOTE": HF}) == {"HF_TOKEN": MASK, "PATH": "/bin", "NOTE": MASK}


def test_write_private_is_owner_only_and_leaves_no_temp_on_failure(tmp_path) -> None:
    target = tmp_path / "rec.json"
    write_private(target, "{}")
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    with pytest.raises(OSError):
        write_private(tmp_path / "missing-dir" / "x.json", "{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rec.json"]
