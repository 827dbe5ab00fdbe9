"""Token hashes in the config and the ``icefloe token`` command."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import textwrap

import pytest

from icefloe.config import load_config
from icefloe.errors import ConfigError
from icefloe.tokens import TokenHashError, hash_token, new_token, parse_hash
from icefloe_app.cli import main

STREAM = """
[[streams]]
name = "pageviews"
table = "web.pageviews"
columns = [{ name = "url", type = "string" }]
"""


def write(tmp_path, text: str):
    path = tmp_path / "icefloe.toml"
    path.write_text(textwrap.dedent(text))
    return path


def test_should_verify_a_token_against_its_hash_only():
    token = new_token()
    assert token.startswith("ifl_")
    assert len(token) == 47
    line = hash_token(token, log2_n=10)
    assert line.startswith("scrypt$ln=10,r=8,p=1$")
    assert token not in line
    entry = parse_hash(line)
    assert entry.verify(token)
    assert not entry.verify(token[:-1])
    assert not entry.verify("")
    assert hash_token(token, log2_n=10) != line  # a fresh salt every time


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode().rstrip("=")


def test_should_verify_pbkdf2_hashes_made_elsewhere():
    salt = b"0123456789abcdef"
    digest = hashlib.pbkdf2_hmac("sha256", b"tok-en", salt, 20_000)
    entry = parse_hash(f"pbkdf2-sha256$20000${b64(salt)}${b64(digest)}")
    assert entry.verify("tok-en")
    assert not entry.verify("tok-en2")


@pytest.mark.parametrize(("line", "reason"), [
    ("scrypt$ln=14,r=8$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", "scrypt parameters must read"),
    ("scrypt$ln=30,r=8,p=1$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", "out of range"),
    ("scrypt$ln=14,r=8,p=1$!!$aGFzaGhhc2hoYXNoaGFzaA", "salt is not base64"),
    ("scrypt$ln=14,r=8,p=1$c2FsdA$aGFzaGhhc2hoYXNoaGFzaA", "salt is shorter"),
    ("pbkdf2-sha256$10$c2FsdHNhbHQ$aGFzaGhhc2hoYXNoaGFzaA", "iterations must be"),
    ("md5$abc", "not a token hash"),
])
def test_should_explain_a_malformed_hash(line, reason):
    with pytest.raises(TokenHashError, match=reason):
        parse_hash(line)


def test_should_refuse_plain_text_tokens_in_the_config_without_echoing_them(tmp_path):
    path = write(tmp_path, STREAM + 'tokens = ["my-plain-s3cret"]\n')
    with pytest.raises(ConfigError) as info:
        load_config(path)
    message = str(info.value)
    assert message.startswith(f"{path}: streams[0].tokens[0]: not a token hash;")
    assert "icefloe token hash" in message
    assert "my-plain-s3cret" not in message


def test_should_check_named_tokens_and_their_scopes(tmp_path):
    line = hash_token("tok", log2_n=10)
    cases = {
        f'name = "web"\nhash = "{line}"\nstreams = ["nope"]': "tokens[0].streams[0]: unknown "
                                                             "stream 'nope'",
        f'name = "web"\nhash = "{line}"\nstreams = []': "tokens[0].streams: name the streams",
        f'name = "web"\nhash = "{line}"\nstreams = ["*", "pageviews"]': "already means every",
        'name = "web"\nhash = "plain"\nstreams = ["*"]': "tokens[0].hash: not a token hash",
        f'name = "has space"\nhash = "{line}"\nstreams = ["*"]': "tokens[0].name:",
        (f'name = "web"\nhash = "{line}"\nstreams = ["*"]\n'
         "rate_limit = { burst_s = 2 }"): "tokens[0].rate_limit: set events_per_s",
    }
    for body, expected in cases.items():
        path = write(tmp_path, STREAM + "[[tokens]]\n" + body + "\n")
        with pytest.raises(ConfigError, match=expected.replace("[", r"\[").replace("]", r"\]")
                           .replace("*", r"\*")):
            load_config(path)
    twice = STREAM + 2 * f'[[tokens]]\nname = "web"\nhash = "{line}"\nstreams = ["*"]\n'
    with pytest.raises(ConfigError, match=r"tokens\[1\].name: duplicate token name 'web'"):
        load_config(write(tmp_path, twice))


def test_should_hash_a_token_read_from_stdin(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("from-stdin-token\n"))
    assert main(["token", "hash"]) == 0
    line = capsys.readouterr().out.strip()
    assert parse_hash(line).verify("from-stdin-token")
    assert "from-stdin-token" not in line


@pytest.mark.parametrize(("stdin", "reason"), [
    ("", "the token is empty"), ("zq-first zq-second\n", "whitespace"),
    ("zq-line-one\nzq-line-two\n", "more than one line"),
])
def test_should_refuse_unusable_tokens_on_stdin(monkeypatch, capsys, stdin, reason):
    monkeypatch.setattr("sys.stdin", io.StringIO(stdin))
    assert main(["token", "hash"]) == 2
    err = capsys.readouterr().err
    assert reason in err
    for word in stdin.split():
        assert word not in err


def test_should_not_take_the_token_as_an_argument(capsys):
    with pytest.raises(SystemExit):
        main(["token", "hash", "s3cret-on-the-command-line"])


def test_should_make_a_new_token_and_say_which_entry_it_matches(tmp_path, monkeypatch, capsys):
    assert main(["token", "new", "--json"]) == 0
    made = json.loads(capsys.readouterr().out)
    path = write(tmp_path, STREAM + f'[[tokens]]\nname = "web"\nhash = "{made["hash"]}"\n'
                                    'streams = ["pageviews"]\n')
    monkeypatch.setattr("sys.stdin", io.StringIO(made["token"] + "\n"))
    assert main(["token", "check", "--config", str(path)]) == 0
    assert capsys.readouterr().out.strip() == "matches web: may write to pageviews"
    monkeypatch.setattr("sys.stdin", io.StringIO("ifl_not-it\n"))
    assert main(["token", "check", "--config", str(path)]) == 1
    assert "matches no hash" in capsys.readouterr().err
