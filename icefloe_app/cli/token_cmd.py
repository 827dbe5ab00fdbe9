"""``icefloe token new|hash|check``: make write tokens and the hash lines the config holds.

Why tokens never come from the command line: arguments end up in shell history, ``ps``
output and CI logs. ``hash`` and ``check`` read the token from stdin (a terminal prompt
does not echo it); only ``new`` prints a token, once, because it just made it.
"""

from __future__ import annotations

import argparse
import getpass
import sys
from typing import Any

from icefloe.errors import ConfigError, IcefloeError
from icefloe.tokens import check_token_text, hash_token, new_token
from icefloe_app.cli.common import print_json
from icefloe_app.cli.config_args import add_config_arguments, config_from_args

EPILOG = """\
Paste a hash line into icefloe.toml, either for one stream:

  [[streams]]
  name = "pageviews"
  tokens = ["scrypt$ln=14,r=8,p=1$..."]

or as a named token for several streams (with its own optional rate limit):

  [[tokens]]
  name = "web-frontend"
  hash = "scrypt$ln=14,r=8,p=1$..."
  streams = ["pageviews", "orders"]      # or ["*"] for every stream
"""


def register(commands: Any) -> None:
    parser = commands.add_parser(
        "token", help="make write tokens and their hashes for the config",
        description="Write tokens are stored in the config only as salted scrypt hashes. "
                    "`new` makes a token and its hash; `hash` hashes a token read from "
                    "stdin; `check` says which configured entry a token (from stdin) matches.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    what = parser.add_subparsers(dest="what", metavar="WHAT", required=True)

    new = what.add_parser("new", help="a fresh random token and its hash line",
                          description="Print a fresh 256-bit token (give it to the client; "
                                      "icefloe keeps no copy) and the hash line to paste.")
    new.add_argument("--json", action="store_true", help='print {"token": ..., "hash": ...}')
    new.set_defaults(run=run_new)

    hashed = what.add_parser("hash", help="hash a token read from stdin",
                             description="Read one token from stdin (a terminal prompts "
                                         "without echo) and print its hash line.")
    hashed.set_defaults(run=run_hash)

    check = what.add_parser("check", help="which configured entry a token (stdin) matches",
                            description="Read one token from stdin and say which configured "
                                        "token entry it matches and where it may write. "
                                        "Exit 1 if it matches none.")
    add_config_arguments(check, example=True)
    check.set_defaults(run=run_check)


def read_token() -> str:
    """One token from stdin: a no-echo prompt on a terminal, else the first line.

    Raises:
        ConfigError: nothing was read, several lines were given, or the token could never
            be sent in an ``Authorization`` header (the message never repeats it).
    """
    if sys.stdin.isatty():
        text = getpass.getpass("token: ")
    else:
        lines = [line for line in sys.stdin.read().splitlines() if line.strip()]
        if len(lines) > 1:
            raise ConfigError("stdin holds more than one line: give one token per call")
        text = lines[0] if lines else ""
    try:
        check_token_text(text)
    except ValueError as exc:
        raise ConfigError(f"cannot use that token: {exc}") from None
    return text


def run_new(args: argparse.Namespace) -> int:
    token = new_token()
    line = hash_token(token)
    if args.json:
        print_json({"token": token, "hash": line})
        return 0
    print(f"token  {token}")
    print(f"hash   {line}")
    print("Give the token to the client (Authorization: Bearer <token>); paste the hash "
          "into icefloe.toml. icefloe keeps no copy of the token.", file=sys.stderr)
    return 0


def run_hash(args: argparse.Namespace) -> int:
    print(hash_token(read_token()))
    return 0


def run_check(args: argparse.Namespace) -> int:
    from ingestor.auth import credentials  # startup time

    _, config = config_from_args(args, example=True)
    token = read_token()
    for credential in credentials(config):
        if credential.hash.verify(token):
            where = "every stream" if credential.streams is None \
                else ", ".join(sorted(credential.streams))
            print(f"matches {credential.name}: may write to {where}")
            return 0
    raise IcefloeError("the token matches no hash in the config")
